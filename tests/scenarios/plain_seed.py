"""The seed stall as a user writes it: no ddpwatch import anywhere. Run under torchrun (RANK, WORLD_SIZE, MASTER_*).

`plain_seed.py` (or `seed`): rank 0 alone calls the DDP wrapper in validation; DDP.forward's buffer broadcast
waits for rank 1, which waits in the next barrier. `subset`: rank 0 alone calls all_reduce (no DDP: quicker).
`busy:N`: rank 0 works N seconds in Python while rank 1 waits in a barrier: a live job that is not (yet) hung.
PLAIN_SEED_PG_TIMEOUT (seconds) bounds the process group, so without ddpwatch the job ends in torch's own error.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def seed(rank):
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        with torch.no_grad():
            model(torch.randn(8, 4))  # the bug: the DDP wrapper on rank 0 only  # LINE:plain_ddp_call
    dist.barrier()  # LINE:plain_barrier


def subset(rank):
    dist.barrier()
    if rank == 0:
        dist.all_reduce(torch.ones(1))  # LINE:plain_subset_all_reduce
    dist.barrier()


def say(text):
    # One write, line and newline together: print() writes them apart, and the other rank's line, in the same
    # torchrun output, once landed in between ("= FalsePLAIN-SEED rank 0 ...", seen in CI).
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def busy(rank, seconds):
    dist.barrier()
    say(f"PLAIN-SEED busy pid {os.getpid()} rank {rank}")
    if rank == 0:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)  # LINE:plain_busy_loop
    dist.barrier()  # LINE:plain_busy_barrier


def main():
    case = sys.argv[1] if len(sys.argv) > 1 else "seed"
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=float(os.environ.get("PLAIN_SEED_PG_TIMEOUT", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    # What the tests ask the rank itself (not its output, which holds any path: a checkout named ddpwatch)
    imported = "ddpwatch" in sys.modules
    say(f"PLAIN-SEED rank {rank} imports the ddpwatch package = {imported}")
    if case == "seed":
        seed(rank)
    elif case == "subset":
        subset(rank)
    elif case.startswith("busy:"):
        busy(rank, float(case.split(":")[1]))
    else:
        raise SystemExit(f"unknown case {case}")
    dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
