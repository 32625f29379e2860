"""Real hang reproductions for the multi-process tests: `python hangs.py CASE`; lines tagged `# LINE:name`."""

import os
import sys
import time

import torch
import torch.distributed as dist

import ddpwatch


def collective_on_subset(rank):
    value = torch.ones(1)
    dist.barrier()
    if rank == 0:
        dist.all_reduce(value)  # LINE:subset_all_reduce
    dist.barrier()  # LINE:subset_barrier


def busy(rank, seconds):
    dist.barrier()
    if rank == 0:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)  # LINE:busy_loop
    dist.barrier()  # LINE:busy_barrier


def matched(rank):
    for _ in range(50):
        dist.all_reduce(torch.ones(4))
    dist.barrier()


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    with ddpwatch.guard():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
        if case == "collective_on_subset":
            collective_on_subset(rank)
        elif case.startswith("busy:"):
            busy(rank, float(case.split(":")[1]))
        elif case == "matched":
            matched(rank)
        else:
            raise SystemExit(f"unknown case {case}")
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
