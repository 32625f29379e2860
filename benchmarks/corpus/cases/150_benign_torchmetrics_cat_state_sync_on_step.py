"""torchmetrics "Implementing a Metric": sum and cat states, uneven per-rank lengths, dist_sync_on_step; correct."""

EXPECT = {
    "source": "https://lightning.ai/docs/torchmetrics/stable/user-guide/implement.md",
    "summary": "torchmetrics' guide to custom metrics: states registered with add_state(dist_reduce_fx='sum') are "
    "summed across processes and list states with dist_reduce_fx='cat' are gathered and concatenated, even "
    "when each process holds a different number of elements (the gather pads to the largest size). With "
    "dist_sync_on_step=True every forward() also syncs, so every rank calls forward the same number of times "
    "(here 4 per epoch, batch sizes differ by rank), and compute() runs on every rank: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import torch
import torch.distributed as dist
from torchmetrics import Metric


class ErrorStats(Metric):
    """Mean absolute error (sum states) and the median of all errors (cat state)."""

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("abs_sum", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("errors", default=[], dist_reduce_fx="cat")

    def update(self, preds, target):
        err = (preds - target).abs()
        self.abs_sum += err.sum()
        self.count += err.numel()
        self.errors.append(err)

    def compute(self):
        errors = self.errors if isinstance(self.errors, torch.Tensor) else torch.cat(self.errors)
        return {"mae": self.abs_sum / self.count, "median": errors.median(), "n": errors.numel()}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    metric = ErrorStats(dist_sync_on_step=True)
    gen = torch.Generator().manual_seed(20 + rank)
    for epoch in range(2):
        for step in range(4):  # same number of forward() calls on every rank: each one syncs
            n = 2 + rank + step  # rank 1 always has one more element: uneven cat states
            preds, target = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
            batch = metric(preds, target)  # dist_sync_on_step: the batch value is synced across ranks
            print(f"[rank{rank}] epoch {epoch} step {step} batch mae {batch['mae'].item():.4f} n {batch['n']}")
        total = metric.compute()  # every rank
        print(
            f"[rank{rank}] epoch {epoch} mae {total['mae'].item():.4f} median {total['median'].item():.4f} "
            f"n {total['n']}"
        )
        metric.reset()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
