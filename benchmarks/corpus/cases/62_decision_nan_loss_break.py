"""NVIDIA-NeMo/Speech#578: a rank whose loss turns NaN/inf breaks out of the step loop; the others train on."""

EXPECT = {
    "source": "https://github.com/NVIDIA-NeMo/Speech/pull/578",
    "summary": "'Initial fix for hanging bug when NaN/inf loss is encountered': the training action logged 'Loss "
               "is NaN or inf', zeroed the gradients, set nan = True and broke out of the training loop on the "
               "rank that saw it, which hung multi-GPU runs; the fix sets a flag and terminates at the next "
               "eval step 'to avoid desync and hanging' (distilled: rank 1's shard holds one corrupt utterance "
               "whose features overflow).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [1],
    "line": "nan_break",
    "fix": ["all_reduce", "broadcast"],
}

import logging
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def shard(rank):
    generator = torch.Generator().manual_seed(rank)
    batches = []
    for index in range(6):
        x = torch.randn(8, 16, generator=generator)
        if rank == 1 and index == 3:
            x[2] = 3.0e38  # a corrupt utterance: its features overflow to inf in the first layer
        batches.append((x, torch.randint(0, 4, (8,), generator=generator)))
    return batches


def train(model, optimizer, loader, epochs):
    nan = False
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            mark()
            loss = nn.functional.cross_entropy(model(x), y)
            if not torch.isfinite(loss):
                logging.warning("Loss is NaN or inf (epoch %d step %d)", epoch, step)
                optimizer.zero_grad()
                nan = True
                break  # LINE:nan_break
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        if nan:
            break
    return nan


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                                  nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    diverged = train(model, optimizer, shard(rank), epochs=3)
    print(f"[rank{rank}] training finished, diverged={diverged}", file=sys.stderr, flush=True)
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
