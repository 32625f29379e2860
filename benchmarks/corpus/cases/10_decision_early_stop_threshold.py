"""Lightning-AI/pytorch-lightning#379: a threshold early stop on each rank's own validation accuracy stops one rank."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/pytorch-lightning/issues/379",
    "summary": "'Early stopping with ddp bug': with a threshold early-stopping callback, when the stop condition "
               "is met in some subprocesses but not all, those stop and the others keep running: training "
               "hangs (distilled to plain DDP: Lightning 2.x now reduces the stop decision itself).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [1],
    "line": "threshold_break",
    "fix": ["all_reduce", "broadcast"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

THRESHOLD = 0.9


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def shard(rank, n, generator):
    # Rank 1's validation shard happens to hold only easy samples; rank 0's labels are noisy.
    x = torch.randn(n, 8, generator=generator)
    y = (x[:, 0] > 0).long()
    if rank == 1:
        x[:, 0] = x[:, 0].sign() * 3.0
    else:
        y = torch.randint(0, 2, (n,), generator=generator)
    return x, y


def accuracy(module, x, y):
    with torch.no_grad():
        return (module(x).argmax(1) == y).float().mean().item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(rank)
    val_x, val_y = shard(rank, 64, generator)
    for epoch in range(10):
        for _ in range(8):
            x = torch.randn(16, 8, generator=generator)
            mark()
            loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        val_acc = accuracy(model.module, val_x, val_y)
        model.train()
        print(f"[rank{rank}] epoch {epoch} val_acc {val_acc:.2f}", file=sys.stderr, flush=True)
        if val_acc > THRESHOLD:
            print(f"[rank{rank}] Epoch {epoch}: early stopping", file=sys.stderr, flush=True)
            break  # LINE:threshold_break
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
