"""HF Accelerate multi_process_metrics example: prepare, backward, gather_for_metrics with an uneven tail; correct."""

EXPECT = {
    "source": "https://github.com/huggingface/accelerate/blob/main/examples/by_feature/multi_process_metrics.py",
    "summary": "Accelerate's metrics example prepares model, optimizer and dataloaders, trains with "
    "accelerator.backward, and in evaluation calls accelerator.gather_for_metrics on every batch of every "
    "process; the prepared eval loader pads the uneven last batch so each process runs the same number of "
    "gathers, and gather_for_metrics drops the duplicated samples. Then wait_for_everyone and a save on the "
    "main process (accelerator.save). All collectives match: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import os
import shutil
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def make_data(n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=gen)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def main():
    warnings.filterwarnings("ignore")
    accelerator = Accelerator(cpu=True)  # WORLD_SIZE > 1 in the environment: multi-CPU, gloo
    rank = accelerator.process_index
    set_seed(42)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_dl = DataLoader(make_data(40, 1), batch_size=4, shuffle=True)
    eval_dl = DataLoader(make_data(21, 2), batch_size=4, shuffle=False)  # 21 samples: an uneven tail
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    for epoch in range(2):
        model.train()
        for x, y in train_dl:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        preds, refs = [], []
        for x, y in eval_dl:
            with torch.no_grad():
                logits = model(x)
            p, r = accelerator.gather_for_metrics((logits.argmax(dim=-1), y))  # every process, every batch
            preds.append(p)
            refs.append(r)
        preds, refs = torch.cat(preds), torch.cat(refs)
        acc = (preds == refs).float().mean().item()
        print(f"[rank{rank}] epoch {epoch} eval samples {preds.numel()} accuracy {acc:.4f}")

    accelerator.wait_for_everyone()
    folder = tempfile.mkdtemp(prefix="acc_ckpt_") if accelerator.is_main_process else None
    if accelerator.is_main_process:
        accelerator.save(accelerator.unwrap_model(model).state_dict(), os.path.join(folder, "model.pt"))
        state = torch.load(os.path.join(folder, "model.pt"))
        print(f"[rank{rank}] saved checksum {sum(t.sum().item() for t in state.values()):.4f}")
        shutil.rmtree(folder)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
