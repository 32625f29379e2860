"""NeMo Automodel FirstRankPerNode: rank 0 prepares data while the others wait in a monitored_barrier; correct."""

EXPECT = {
    "source": "https://github.com/NVIDIA-NeMo/Automodel/blob/147726cae97271f52a6c342959905e047d220348/nemo_automodel/components/distributed/utils.py",  # noqa: E501
    "summary": "FirstRankPerNode is a context manager that lets rank 0 run a section (dataset preprocessing, "
    "cache building) before the other ranks: non-zero ranks wait on entry in _barrier_with_timeout, "
    "which makes a temporary gloo group and calls monitored_barrier(timeout=...), and rank 0 enters the "
    "same barrier when it leaves the section. The others wait as long as rank 0 works, then read the "
    "cache it wrote.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def barrier_with_timeout(timeout):
    gloo_group = dist.new_group(backend="gloo", timeout=timeout)
    try:
        dist.monitored_barrier(group=gloo_group, timeout=timeout)
    finally:
        dist.destroy_process_group(gloo_group)


class FirstRankPerNode:
    def __init__(self, timeout=timedelta(minutes=10)):
        self.timeout = timeout

    def __enter__(self):
        self.first = dist.get_rank() == 0
        if not self.first:
            barrier_with_timeout(self.timeout)  # wait for rank 0 to finish the section
        return self.first

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.first:
            barrier_with_timeout(self.timeout)  # release the waiting ranks
        return False


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cache = os.path.join(tempfile.gettempdir(), f"prep_cache_{os.environ['MASTER_PORT']}.pt")
    with FirstRankPerNode() as first:
        if first:
            time.sleep(2.0)  # tokenization / preprocessing that only rank 0 does
            torch.manual_seed(0)
            torch.save({"x": torch.randn(64, 8), "y": torch.randn(64, 1)}, cache)
    data = torch.load(cache)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    shard = slice(rank * 32, (rank + 1) * 32)
    for _ in range(5):
        loss = (model(data["x"][shard]) - data["y"][shard]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"[rank{rank}] loss {loss.item():.4f}", flush=True)
    dist.barrier()
    if rank == 0:
        os.remove(cache)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
