"""Lightning-AI/pytorch-lightning#9851: each process draws its own random subset: different batch counts per rank."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/pytorch-lightning/issues/9851",
    "summary": "'ddp training stuck': the progress bar stays at 96% forever; the maintainers: it hangs when the "
               "ranks have an uneven number of batches, e.g. when each process randomly selects its dataset "
               "without a common seed (distilled to plain DDP).",
    "family": "collective",
    "world_size": 2,
    "kind": "uneven_inputs",
    "ranks": [0],
    "line": "uneven_backward",
    "fix": ["join", "drop_last", "seed"],
}

import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def random_subset(rank):
    # No common seed: every process picks its own subset size (here made repeatable by seeding with the rank).
    rng = random.Random(rank)
    size = rng.choice([40, 44, 48]) if rank == 0 else rng.choice([24, 28, 32])
    return TensorDataset(torch.randn(size, 8), torch.randn(size, 1))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(random_subset(rank), batch_size=8):
        mark()
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # LINE:uneven_backward
        optimizer.step()
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
