"""pytorch/pytorch#22834: each rank times itself and leaves an endless training stream when its own budget is spent."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/22834",
    "summary": "'Script freezes with no output when using DistributedDataParallel': the training loop breaks "
               "when `finish - start >= mintime`, each process timing itself; the maintainer: 'You have timing "
               "code in there. It is possible that one process exits before the other one, causing the hang.' "
               "(distilled: an endless stream made by a generator, and a per-rank wall-clock budget whose clock "
               "rank 1 starts before rank 0, which first loads a larger shard).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [1],
    "line": "budget_break",
    "fix": ["all_reduce", "broadcast"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_S = 2.0


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def load_shard(rank):
    # Rank 0's shard is larger and takes longer to read and decode than rank 1's.
    generator = torch.Generator().manual_seed(rank)
    rows = 4096 if rank == 0 else 512
    time.sleep(1.5 if rank == 0 else 0.1)
    x = torch.randn(rows, 8, generator=generator)
    return list(zip(x.split(16), (x.sum(1, keepdim=True)).split(16)))


def stream(shard):
    while True:
        yield from shard


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = stream(load_shard(rank))
    start = time.time()
    step = 0
    for x, y in batches:
        mark()
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.05)  # the rest of a real step's compute
        step += 1
        if time.time() - start > BUDGET_S:
            print(f"[rank{rank}] time budget spent after {step} steps", file=sys.stderr, flush=True)
            break  # LINE:budget_break
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
