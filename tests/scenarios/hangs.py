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


def async_polled(rank):
    """Rank 0's all_reduce is async and its thread polls the Work in a sleep loop: it waits outside torch (as an
    NCCL rank blocks at a device sync); rank 1 broadcasts at the same position. They can never match."""
    values = torch.ones(4)
    dist.barrier()
    if rank == 0:
        work = dist.all_reduce(values, async_op=True)  # LINE:polled_all_reduce
        while not work.is_completed():
            time.sleep(0.01)  # LINE:polled_sleep
    else:
        dist.broadcast(values, src=1)  # LINE:polled_broadcast
    dist.barrier()


def min_waited(rank):
    """Correct: every rank reduces with MIN; rank 0 waits inside each call (a look finds it in flight), then a few
    SUMs so that the watchdog reads and compares them."""
    for _ in range(4):
        if rank == 1:
            time.sleep(0.6)
        dist.all_reduce(torch.ones(1), op=dist.ReduceOp.MIN)
    for _ in range(10):
        dist.all_reduce(torch.ones(1))
        time.sleep(0.2)


def async_overlap(rank):
    """Correct: rank 0 overlaps an all_reduce on one group (async_op=True) with computation and a barrier on another
    group, then waits on it; rank 1 calls the barrier first, then the all_reduce. While rank 0 computes, each rank
    holds an op on a group the other is not in yet: not a crossing, since rank 0 waits on nothing."""
    metrics, sync = dist.new_group([0, 1]), dist.new_group([0, 1])
    values = torch.ones(4)
    for _ in range(2):
        if rank == 0:
            work = dist.all_reduce(values, group=metrics, async_op=True)  # LINE:overlapped_all_reduce
            time.sleep(2.5)  # the computation it overlaps: longer than grace, shorter than timeout
            dist.barrier(group=sync)
            work.wait()
        else:
            dist.barrier(group=sync)
            dist.all_reduce(values, group=metrics)


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
        elif case == "async_polled":
            async_polled(rank)
        elif case == "min_waited":
            min_waited(rank)
        elif case == "async_overlap":
            async_overlap(rank)
        elif case == "matched":
            matched(rank)
        else:
            raise SystemExit(f"unknown case {case}")
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
