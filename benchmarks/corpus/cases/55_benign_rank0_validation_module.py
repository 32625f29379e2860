"""discuss.pytorch.org 114522, fixed: rank 0 validates with model.module for seconds; rank 1 waits: not hung."""

EXPECT = {
    "source": "https://discuss.pytorch.org/t/torch-distributed-barrier-hangs-in-ddp/114522",
    "summary": "The fix given in 'torch.distributed.barrier() hangs in DDP': rank-0-only validation must call "
               "the wrapped module (model.module), which does no collective. A correct program: rank 0 "
               "validates for several seconds while rank 1 waits at the epoch barrier.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def encoder():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def validation(model, seconds=2.5):
    # A long validation set: batches until about `seconds` of work is done.
    losses, start = [], time.time()
    with torch.no_grad():
        while time.time() - start < seconds:
            outputs = model.module(torch.randn(32, 3, 32, 32))
            losses.append(nn.functional.cross_entropy(outputs, torch.randint(0, 10, (32,))))
    return sum(losses) / len(losses)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(encoder())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.randint(0, 10, (4,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: validation loss {validation(model):.3f}", file=sys.stderr, flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
