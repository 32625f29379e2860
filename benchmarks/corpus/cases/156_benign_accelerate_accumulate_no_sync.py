"""HF Accelerate gradient_accumulation example: accelerator.accumulate skips the all-reduce off-boundary; correct."""

EXPECT = {
    "source": "https://github.com/huggingface/accelerate/blob/main/examples/by_feature/gradient_accumulation.py",
    "summary": "Accelerate's gradient accumulation example wraps each step in `with accelerator.accumulate(model):`; "
    "on non-boundary steps it enters DDP's no_sync() so backward does no all-reduce, and the prepared "
    "optimizer only steps on the boundary (or at the end of the dataloader, where accelerate forces a sync "
    "for a short last window). The prepared dataloader gives every process the same number of batches, so "
    "the all-reduces happen on the same steps everywhere: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def main():
    warnings.filterwarnings("ignore")
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    rank = accelerator.process_index
    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(56, 8, generator=gen)  # 7 batches of 4 per process: windows of 3, 3 and a short 1
    loader = DataLoader(TensorDataset(x, x.norm(dim=1, keepdim=True)), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        syncs = []
        for step, (xb, yb) in enumerate(loader):
            with accelerator.accumulate(model):  # no_sync() unless this is a boundary step
                loss = nn.functional.mse_loss(model(xb), yb)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    syncs.append(step)
                optimizer.step()  # a no-op off the boundary
                optimizer.zero_grad()
        checksum = sum(p.detach().sum().item() for p in model.parameters())
        print(f"[rank{rank}] epoch {epoch} synced at steps {syncs} checksum {checksum:.5f}")
    accelerator.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
