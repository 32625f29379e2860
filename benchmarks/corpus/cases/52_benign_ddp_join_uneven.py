"""pytorch/pytorch#38174: DDP's join() lets ranks with fewer batches shadow the others' collectives: no hang."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/38174",
    "summary": "'[RFC] Join-based API to support uneven inputs in DDP': DDP requires an equal number of inputs on "
               "every process; the join API lets ranks that run out of data keep matching the others' "
               "all-reduces. A correct program: uneven batch counts inside model.join() finish.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n_batches = 5 if rank == 0 else 12  # uneven shards
    with model.join():
        for _ in range(n_batches):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print(f"[rank{rank}] finished {n_batches} batches", file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
