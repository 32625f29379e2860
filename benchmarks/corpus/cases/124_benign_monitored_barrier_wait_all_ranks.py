"""torch test_monitored_barrier_gloo: all-reduces, then monitored_barrier(timeout, wait_all_ranks=True); correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/blob/a069159c00b60fc660b36e63b9863cb6b30cda16/torch/testing/_internal/distributed/distributed_test.py",  # noqa: E501
    "summary": "test_monitored_barrier_gloo runs rounds of all_reduce and then dist.monitored_barrier(timeout=...), "
    "once plain and once with wait_all_ranks=True, and expects them to pass when every rank arrives. "
    "Here it guards a checkpoint: after each epoch rank 0 writes a checkpoint (a short sleep) and all "
    "ranks meet in monitored_barrier(wait_all_ranks=True) well inside the timeout.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import io
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(rank)
    timeout = timedelta(seconds=30)
    for epoch in range(2):
        for _ in range(5):
            loss = model(torch.randn(8, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        dist.monitored_barrier(timeout=timeout)
        if rank == 0:
            buffer = io.BytesIO()
            torch.save(model.module.state_dict(), buffer)  # checkpoint write on rank 0
            time.sleep(1.0)
        dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
        print(f"[rank{rank}] epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
