"""mlcommons/algorithmic-efficiency#412: only rank 0 restores the step counter, so it leaves the loop early."""

EXPECT = {
    "source": "https://github.com/mlcommons/algorithmic-efficiency/issues/412",
    "summary": "'Resuming from checkpoint fails when using TORCH_DDP': get_log_dir() returns None for every "
               "process but rank 0, so rank 0 loads the checkpoint and the others don't; the processes have "
               "inconsistent states and hang.",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [0],
    "line": "resume_break",
    "fix": ["all_reduce", "broadcast"],
}

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

MAX_STEPS = 6


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def get_log_dir(rank):
    # As in the thread: the experiment directory is only resolved on rank 0; every other rank gets None.
    if rank != 0:
        return None
    return os.path.join(tempfile.gettempdir(), f"corpus-resume-{os.environ['MASTER_PORT']}")


def restore_step(log_dir):
    checkpoint = os.path.join(log_dir, "checkpoint.pt") if log_dir else None
    if checkpoint and os.path.exists(checkpoint):
        return torch.load(checkpoint)["global_step"]
    return 0


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log_dir = get_log_dir(rank)
    if log_dir:  # what the interrupted run left behind: a checkpoint at step 3
        os.makedirs(log_dir, exist_ok=True)
        torch.save({"global_step": 3}, os.path.join(log_dir, "checkpoint.pt"))
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    global_step = restore_step(log_dir)
    while True:
        if global_step >= MAX_STEPS:
            break  # LINE:resume_break
        mark()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        global_step += 1
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
