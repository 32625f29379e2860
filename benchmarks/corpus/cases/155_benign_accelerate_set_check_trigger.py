"""HF Accelerate early_stopping example: a rank-local set_trigger, check_trigger on every rank each step; correct."""

EXPECT = {
    "source": "https://github.com/huggingface/accelerate/blob/main/examples/by_feature/early_stopping.py",
    "summary": "Accelerate's early-stopping example: after each training step every process calls "
    "callback.check_early_stopping(loss) on its own loss and, if it says stop, accelerator.set_trigger(); then "
    "EVERY process calls accelerator.check_trigger(), which all-reduces the flag, so all processes break out "
    "of the loop after the same step even though only one of them wanted to. The evaluation that follows "
    "(gather_for_metrics) runs on all processes: correct.",
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


class EarlyStoppingCallback:
    """Stops when the local loss has not improved for `patience` steps (as in the example)."""

    def __init__(self, min_delta=0.0, patience=2):
        self.min_delta, self.patience = min_delta, patience
        self.counter, self.lowest_loss = 0, float("inf")

    def check_early_stopping(self, loss):
        delta = self.lowest_loss - loss
        if delta >= self.min_delta:
            self.lowest_loss, self.counter = loss, 0
        else:
            self.counter += 1
        return self.counter >= self.patience


def main():
    warnings.filterwarnings("ignore")
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    set_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)  # a large step: the loss soon bounces
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(128, 6, generator=gen)
    data = TensorDataset(x, (x[:, 0] * x[:, 1] > 0).long())
    train_dl = DataLoader(data, batch_size=4, shuffle=False)
    eval_dl = DataLoader(data, batch_size=16)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)
    callback = EarlyStoppingCallback(min_delta=0.0, patience=3)
    for epoch in range(3):
        model.train()
        steps, mine = 0, False
        callback.counter = 0  # a fresh patience window each epoch
        for xb, yb in train_dl:
            loss = nn.functional.cross_entropy(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            mine = callback.check_early_stopping(loss.item())  # this process's own loss
            if mine:
                accelerator.set_trigger()
            if accelerator.check_trigger():  # all-reduce of the flag: every process, every step
                break
        model.eval()
        correct = total = 0
        for xb, yb in eval_dl:
            with torch.no_grad():
                preds = model(xb).argmax(dim=-1)
            preds, refs = accelerator.gather_for_metrics((preds, yb))
            correct += (preds == refs).sum().item()
            total += refs.numel()
        print(f"[rank{rank}] epoch {epoch} stopped after {steps} steps (own trigger {mine}), acc {correct / total:.4f}")
    accelerator.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
