"""Fault injection for the reliability tests: `python faults.py CASE`; lines tagged `# LINE:name`."""

import datetime
import json
import os
import resource
import signal
import sys
import time

import torch
import torch.distributed as dist

import ddpwatch


def killed(rank):
    for step in range(1000):
        if rank == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # LINE:killed
        dist.all_reduce(torch.ones(2))  # LINE:killed_peer_wait
        time.sleep(0.01)


def stop_and_resume(rank):
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # the test sends SIGCONT after the report
    dist.barrier()
    for _ in range(5):
        dist.all_reduce(torch.ones(2))


def make_transport_slow():
    """Every all_reduce takes 3 s in the "transport" on every rank, and completes (installed before the guard)."""
    import torch.distributed.distributed_c10d as c10d

    real = c10d.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        time.sleep(3.0)
        return real(tensor, op=op, group=group, async_op=async_op)

    c10d.all_reduce = dist.all_reduce = all_reduce


def slow_transport(rank):
    for _ in range(3):
        dist.all_reduce(torch.ones(2))  # slow, on every rank, and it completes: never a deadlock


def benign(rank, seconds, epochs):
    """Rank 0 validates alone for `seconds` each epoch (under the timeout) while the others wait: no report."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4),
                                                                          torch.nn.BatchNorm1d(4)))
    for epoch in range(epochs):
        for _ in range(5):
            model(torch.randn(8, 4)).sum().backward()
            dist.all_reduce(torch.ones(1))
        if rank == 0:
            deadline = time.monotonic() + seconds
            with torch.no_grad():
                while time.monotonic() < deadline:
                    model.module(torch.randn(8, 4))
                    time.sleep(0.01)
        else:
            print(f"BENIGN-WAITS {epoch}", file=sys.stderr, flush=True)  # a test acts once rank 1 waits
        dist.barrier()


def store_gone(rank):
    """The store's host disappears after init; then the seed stall: each rank must dump itself."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4),
                                                                          torch.nn.BatchNorm1d(4)))
    model(torch.randn(8, 4)).sum().backward()
    dist.barrier()
    if rank == 0:
        os.kill(int(os.environ["STORE_PID"]), signal.SIGKILL)
    time.sleep(2.0)
    if rank == 0:
        with torch.no_grad():
            model(torch.randn(8, 4))  # LINE:store_gone_ddp_call
    dist.barrier()


def internal_error(rank):
    """ddpwatch's own analysis raises on every round: training must not notice."""
    import ddpwatch.analysis as analysis

    def broken(*args, **kwargs):
        raise RuntimeError("injected ddpwatch bug")

    analysis.assess = broken
    total = torch.zeros(1)
    for step in range(20):
        if rank == 0 and step == 10:
            time.sleep(2.0)  # rank 1 waits past the grace: the watchdog analyses, and the analysis raises
        value = torch.full((1,), float(step + rank))
        dist.all_reduce(value)
        total += value
    dist.barrier()
    print(f"RESULT {total.item()}", flush=True)


def agreed(flag):
    """Whether every rank says `flag` (an all_reduce of it): ranks leave a loop at the same step."""
    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return value.item() == 1.0


def train(rank, seconds):
    """DDP steps for `seconds`, ending on the same step on every rank: a job that trains and never waits long."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    end = time.monotonic() + seconds
    while not agreed(time.monotonic() >= end):
        for _ in range(5):
            model(torch.randn(8, 16)).sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB: what a test compares across runs
    print(f"TRAINED {rank} maxrss_kib {peak}", file=sys.stderr, flush=True)


def poisoned_hang(rank):
    """Steps until the test has written junk at ddpwatch's keys (the file READY_DIR/poisoned), two more seconds of
    them (every watchdog reads the junk), then the seed stall: rank 0 in a barrier, rank 1 in an all_reduce."""
    path = os.path.join(os.environ["READY_DIR"], "poisoned")
    deadline = time.monotonic() + 40
    while not agreed(os.path.exists(path) or time.monotonic() > deadline):
        time.sleep(0.05)
    end = time.monotonic() + 2.0
    while not agreed(time.monotonic() >= end):
        time.sleep(0.05)
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
    if rank == 0:
        dist.barrier()  # LINE:poisoned_barrier
    else:
        dist.all_reduce(torch.ones(2))  # LINE:poisoned_all_reduce


def init():
    if os.environ.get("STORE_PORT"):
        store = dist.TCPStore("127.0.0.1", int(os.environ["STORE_PORT"]), int(os.environ["WORLD_SIZE"]), False,
                              timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo")


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    guarded = os.environ.get("FAULTS_NO_GUARD") != "1"
    if case == "slow_transport":
        make_transport_slow()
    if guarded:
        ddpwatch.install()
    init()
    rank = dist.get_rank()
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
    if case.startswith("benign:"):
        _, seconds, epochs = case.split(":")
        benign(rank, float(seconds), int(epochs))
    elif case.startswith("train:"):
        train(rank, float(case.split(":")[1]))
    else:
        {"killed": killed, "stop_and_resume": stop_and_resume, "slow_transport": slow_transport,
         "store_gone": store_gone, "internal_error": internal_error, "poisoned_hang": poisoned_hang}[case](rank)
    dist.destroy_process_group()
    if guarded:
        ddpwatch.uninstall()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
