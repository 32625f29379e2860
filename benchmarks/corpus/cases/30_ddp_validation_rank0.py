"""discuss.pytorch.org 114522: rank-0-only validation calls the DDP-wrapped encoder; the epoch barrier never ends."""

EXPECT = {
    "source": "https://discuss.pytorch.org/t/torch-distributed-barrier-hangs-in-ddp/114522",
    "summary": "'torch.distributed.barrier() hangs in DDP': validation runs under get_rank() == 0 and calls the "
               "DistributedDataParallel model; the job stalls at the barrier after it (fix: model.module in "
               "validation). The same stall as ddpwatch's demo, written here in the thread's own shape.",
    "family": "collective",
    "world_size": 2,
    "kind": "ddp_forward_on_subset",
    "ranks": [0],
    "line": "validation_forward",
    "fix": ["model.module", ".module("],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def mark():
    # Printed before every collective-bearing call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def encoder():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def validation(model, val_batches):
    losses = []
    with torch.no_grad():
        for data, gt in val_batches:
            mark()
            outputs = model(data)  # LINE:validation_forward
            losses.append(nn.functional.cross_entropy(outputs, gt))
    return sum(losses) / len(losses)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(encoder())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    val_batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(3)]
    for epoch in range(2):
        for _ in range(3):
            mark()
            loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.randint(0, 10, (4,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            dist.barrier()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: validation loss {validation(model, val_batches):.3f}", file=sys.stderr)
        mark()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
