"""NVIDIA-NeMo/Automodel#2468: NoValidAnchorsError is caught with a per-rank continue, skipping the syncing backward."""

EXPECT = {
    "source": "https://github.com/NVIDIA-NeMo/Automodel/pull/2468",
    "summary": "'keep DFlash DDP ranks in lockstep on no-valid-anchor skips': the trainer raises "
               "NoValidAnchorsError when every sample in a micro-batch is too short; the loop caught it with a "
               "per-rank continue (no backward), so the other ranks wait on a gradient reduce that never comes.",
    "family": "exception",
    "world_size": 2,
    "kind": "caught_exception",
    "ranks": [1],
    "line": "anchor_except",
    "fix": ["skip together", "all_reduce a flag", "zero the loss"],
}

import contextlib
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

BLOCK_SIZE = 4
ACCUMULATION = 2


class NoValidAnchorsError(Exception):
    pass


def mark():
    # Printed before every collective-bearing micro-step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def sample_anchors(lengths):
    valid = (lengths >= BLOCK_SIZE).nonzero().flatten()
    if len(valid) == 0:
        raise NoValidAnchorsError("every sample in the micro-batch is shorter than the block size")
    return valid


def micro_batches(rank, step):
    for micro in range(ACCUMULATION):
        lengths = torch.tensor([2, 3, 1, 2]) if (rank == 1 and step == 1 and micro == 1) else torch.tensor([6, 3, 8, 5])
        yield micro, torch.randn(4, 8), lengths


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        for micro, hidden, lengths in micro_batches(rank, step):
            try:
                anchors = sample_anchors(lengths)
            except NoValidAnchorsError:  # LINE:anchor_except
                continue
            sync = micro == ACCUMULATION - 1  # only the last micro-batch all-reduces gradients
            with (contextlib.nullcontext() if sync else model.no_sync()):
                mark()
                model(hidden)[anchors].pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
