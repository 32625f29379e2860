"""Correct jobs with busy ranks (issue 13 point 3): `python busy.py CASE [SECONDS]`; none of them hangs.

gil_hold: rank 0 spends SECONDS in one C call that holds the GIL (sum over a range) between two barriers, so its
watchdog thread cannot run and its heartbeat stops although the process computes at full speed.
cpu_hogs: every rank runs a pure-Python busy loop for SECONDS before a barrier.
gil_sleep: rank 1 sleeps SECONDS in a C function that keeps the GIL (ctypes.PyDLL: h5py on slow storage, a database
driver, a custom extension) between two barriers: its process sleeps in the kernel, using no CPU, and is healthy.
benign_mix: gil_sleep, then rank 0 spends SECONDS in torch matrix products (torch releases the GIL), each between
barriers: the issue-18 list of what a correct job may do.
"""

import ctypes

import os
import sys
import time

import torch
import torch.distributed as dist

import ddpwatch

CALIBRATION_N = 2_000_000


def gil_holding_terms(seconds: float) -> int:
    """How many terms sum(range(n)) needs to hold the GIL for at least `seconds` here (measured, not guessed)."""
    # In this thread's CPU time, not the wall clock: a calibration run while other processes share the cores (a
    # parallel test run) measured a third of the speed, and the hold then ended before the timeout it must outlast
    # (no report, in 1 of 2 full-suite runs). CPU time is never more than the wall clock: the hold lasts at least
    # `seconds`, longer on a busy machine.
    took = []
    for _ in range(5):
        start = time.thread_time()
        sum(range(CALIBRATION_N))
        took.append(time.thread_time() - start)
    return int(CALIBRATION_N * seconds / max(min(took), 1e-4))


def between_barriers(rank, busy_rank, work):
    """`busy_rank` runs work() between two barriers while the others wait in the second; prints how long it took."""
    dist.barrier()
    if rank == busy_rank:
        start = time.monotonic()
        work()
        print(f"BUSY-HELD {time.monotonic() - start:.1f}", file=sys.stderr, flush=True)
    dist.barrier()


def gil_hold(rank, seconds):
    terms = gil_holding_terms(seconds)
    # one C call: the GIL is never released, so no other Python thread runs meanwhile
    between_barriers(rank, 0, lambda: sum(range(terms)))


def cpu_hogs(rank, seconds):
    dist.barrier()
    deadline = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < deadline:
        spins += 1  # pure Python: the interpreter hands the GIL over every few milliseconds
    print(f"BUSY-HELD {seconds:.1f}", file=sys.stderr, flush=True)
    dist.barrier()


def gil_sleep(rank, seconds):
    # libc's sleep(3), called without releasing the GIL
    between_barriers(rank, 1, lambda: ctypes.PyDLL(None).sleep(int(seconds)))


def torch_work(rank, seconds):
    def products():
        deadline, a = time.monotonic() + seconds, torch.randn(768, 768)
        while time.monotonic() < deadline:
            a = torch.tanh(a @ a)  # inside torch's C++ (the GIL released), never in a collective

    between_barriers(rank, 0, products)


def benign_mix(rank, seconds):
    gil_sleep(rank, seconds)
    torch_work(rank, seconds)


CASES = {"gil_hold": gil_hold, "cpu_hogs": cpu_hogs, "gil_sleep": gil_sleep, "benign_mix": benign_mix}


def main():
    case, seconds = sys.argv[1], float(sys.argv[2])
    torch.set_num_threads(1)
    with ddpwatch.guard():
        dist.init_process_group("gloo")
        CASES[case](dist.get_rank(), seconds)
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
