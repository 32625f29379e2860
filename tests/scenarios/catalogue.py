"""Real reproductions of the hang catalogue (issue: diagnosis): `python catalogue.py CASE`; lines tagged `# LINE:`."""

import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import ddpwatch

GROUP_TIMEOUT = datetime.timedelta(seconds=60)  # new_group() does not inherit the default group's timeout


def bn_model():
    return DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))


def skipped(rank):
    model = bn_model()
    for epoch in range(3):
        for _ in range(2):
            model(torch.randn(8, 4)).sum().backward()  # LINE:skip_step
        if rank == 1 and epoch == 1:
            continue
        dist.barrier()  # LINE:skip_barrier


def uneven(rank):
    model = DistributedDataParallel(nn.Linear(4, 4))  # no buffers: the extra step blocks in backward's all-reduce
    batches = 4 if rank == 0 else 3
    for _ in range(batches):
        loss = model(torch.randn(8, 4)).sum()
        loss.backward()  # LINE:uneven_backward
    dist.barrier()  # LINE:uneven_barrier


def shape(rank):
    dist.barrier()
    values = torch.ones(4) if rank == 0 else torch.ones(0)
    dist.all_reduce(values)  # LINE:shape_all_reduce
    dist.barrier()


def rebuild(rank):
    model = DistributedDataParallel(nn.Linear(4, 4))  # no buffers: only the one-time bucket rebuild talks
    model(torch.randn(8, 4)).sum().backward()
    dist.barrier()
    if rank == 0:
        model(torch.randn(8, 4))  # LINE:rebuild_call
    dist.barrier()


def group_order(rank):
    first = dist.new_group([0, 1], timeout=GROUP_TIMEOUT)
    second = dist.new_group([0, 1], timeout=GROUP_TIMEOUT)
    dist.barrier()
    if rank == 0:
        dist.all_reduce(torch.ones(2), group=first)  # LINE:order_first
        dist.all_reduce(torch.ones(2), group=second)
    else:
        dist.all_reduce(torch.ones(2), group=second)  # LINE:order_second
        dist.all_reduce(torch.ones(2), group=first)


def stuck(rank):
    dist.barrier()
    dist.all_reduce(torch.ones(2))  # LINE:stuck_all_reduce


def unresponsive(rank):
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # LINE:stopped
    dist.barrier()  # LINE:unresponsive_barrier


def dead(rank):
    pair = dist.new_group([0, 2], timeout=GROUP_TIMEOUT)
    dist.barrier()
    if rank == 1:
        os._exit(1)  # LINE:dies
    if rank == 0:
        time.sleep(1.0)
        dist.all_reduce(torch.ones(2), group=pair)  # LINE:dead_wait
    else:
        time.sleep(60)


def simulate_transport_fault():
    """Every all_reduce blocks forever in the "transport", on every rank: the program is right, the wire is not."""
    if BACKEND == "fakenccl":
        nccl_like.simulate_stall("allreduce")  # NCCL's call returns; the op never finishes and sync() waits forever
        return
    forever = threading.Event()

    def all_reduce(*args, **kwargs):
        forever.wait()

    import torch.distributed.distributed_c10d as c10d

    c10d.all_reduce = dist.all_reduce = all_reduce


CASES = {"rebuild": rebuild, "skipped": skipped, "uneven": uneven, "shape": shape, "group_order": group_order, "stuck": stuck,
         "unresponsive": unresponsive, "dead": dead}

# CATALOGUE_BACKEND=fakenccl runs the cases on tests/nccl_like.py (NCCL's host-side semantics on CPU): collectives
# return at once there and block the host only where NCCL does (a barrier, DDP's host reads, sync()). Not a DDPWATCH_*
# name: it configures the test, not ddpwatch. (Down here so that the cases keep the line numbers docs/hangs.md shows.)
BACKEND = os.environ.get("CATALOGUE_BACKEND", "gloo")
if BACKEND == "fakenccl":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import nccl_like

    nccl_like.register()


def sync():
    """The end of a program on NCCL reads results on the host (loss.item()): it blocks until its collectives finish."""
    if BACKEND == "fakenccl":
        nccl_like.synchronize()


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    if case == "stuck":
        simulate_transport_fault()
    with ddpwatch.guard():
        dist.init_process_group(BACKEND)
        print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
        CASES[case](dist.get_rank())
        sync()
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
