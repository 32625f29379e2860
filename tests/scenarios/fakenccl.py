"""Probes of the fakenccl test backend on real ranks: `python fakenccl.py CASE`; each rank prints its facts as JSON."""

import contextlib
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import ddpwatch
import ddpwatch.session

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import nccl_like  # noqa: E402

LATE_JOIN_S = 3.0  # rank 1 joins this late; "returns at once" and "blocks for seconds" are told apart against it


def facts(**values):
    print("FACTS " + json.dumps(values), flush=True)


def returns_before_done(rank):
    """Rank 1 joins late: rank 0's calls return at once, incomplete; synchronize() waits for rank 1."""
    if rank == 1:
        time.sleep(LATE_JOIN_S)
    values = torch.full((3,), float(rank + 1))
    start = time.monotonic()
    dist.all_reduce(values)  # synchronous call: on NCCL it returns once queued
    sync_call_s = time.monotonic() - start
    work = dist.all_reduce(values, async_op=True)
    work.wait()  # NCCL: the stream waits, not the host
    returned_s = time.monotonic() - start
    completed_after_wait = work.is_completed()
    nccl_like.synchronize()
    facts(sync_call_s=sync_call_s, returned_s=returned_s, completed_after_wait=completed_after_wait,
          synchronized_s=time.monotonic() - start, completed_after_sync=work.is_completed(), values=values.tolist())


def ddp_trains(rank):
    """Three DDP steps with different data per rank: equal parameters afterwards need DDP's traffic to work."""
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)))
    before = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        nccl_like.synchronize()  # loss.item()
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(after) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, after)
    nccl_like.synchronize()
    facts(params=after.tolist(), moved=not torch.equal(before, after),
          ranks_equal=all(torch.equal(gathered[0], g) for g in gathered), issued=nccl_like.issued())


def main_thread_place():
    """Innermost function of the main thread and whether synchronize() is on its stack."""
    frame = sys._current_frames()[threading.main_thread().ident]
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names[0], "synchronize" in names


def lone_collective(rank):
    """Only rank 0 all-reduces: its thread goes on until synchronize(), where it stays (the test kills it)."""
    if rank != 0:
        time.sleep(120)
        return
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(2), async_op=True)
    dist.all_reduce(torch.ones(2))
    returned_s = time.monotonic() - start
    steps = sum(1 for _ in range(100000))  # the thread is free to keep computing
    report = threading.Thread(target=report_blocked, args=(work, returned_s, steps), daemon=True)
    report.start()
    nccl_like.synchronize()
    facts(synchronize_returned=True)


def report_blocked(work, returned_s, steps):
    time.sleep(2.0)
    innermost, in_synchronize = main_thread_place()
    facts(returned_s=returned_s, steps=steps, completed=work.is_completed(), innermost=innermost,
          in_synchronize=in_synchronize)
    open(os.environ["FAKENCCL_BLOCKED_FILE"], "w").close()  # the test stops the job once this exists


def slow_peer_watched(rank):
    """A correct job under ddpwatch whose rank 1 is slow: rank 0 waits in synchronize() with an all_reduce in flight."""
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    for _ in range(3):
        model(torch.randn(8, 4)).sum().backward()
        nccl_like.synchronize()
    if rank == 1:
        time.sleep(LATE_JOIN_S + 1)  # twice ddpwatch's default grace
    dist.all_reduce(torch.ones(1))
    nccl_like.synchronize()
    dist.barrier()
    facts(finished=True, watched=ddpwatch.session.current() is not None)


CASES = {"returns_before_done": returns_before_done, "ddp_trains": ddp_trains, "lone_collective": lone_collective,
         "slow_peer_watched": slow_peer_watched}


def main():
    torch.set_num_threads(1)
    nccl_like.register()
    watch = ddpwatch.guard() if sys.argv[1].endswith("_watched") else contextlib.nullcontext()
    with watch:
        dist.init_process_group(nccl_like.NAME)
        CASES[sys.argv[1]](dist.get_rank())
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
