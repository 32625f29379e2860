"""pytorch/pytorch#131895: two process groups driven from two threads at once; safe when each group keeps one order."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/pull/131895",
    "summary": "'[C10D] Clarify warning for concurrent PG usage': addresses the common misconception that using "
               "multiple process groups concurrently is unsafe; it is safe as long as every rank issues each "
               "group's collectives in one globally consistent order. A correct program: a background thread "
               "all-reduces metrics on its own group while the main thread trains; one rank's thread is slow.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def metrics_thread(group, rank, rounds):
    for round_ in range(rounds):
        if rank == 1:
            time.sleep(0.8)  # rank 1's metric computation is slow; rank 0's thread waits in the all_reduce
        value = torch.tensor([float(round_ + rank)])
        dist.all_reduce(value, group=group)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    metrics_group = dist.new_group([0, 1])
    thread = threading.Thread(target=metrics_thread, args=(metrics_group, rank, 5), name="metrics")
    thread.start()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(20):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.1)
    thread.join()
    print(f"[rank{rank}] done", file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
