"""pytorch/pytorch#44353: one rank catches an out-of-memory RuntimeError, skips the batch, and the others block."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/44353",
    "summary": "'DDP training with syncBatchNorm, how to catch and handle the exception in training processes?': "
               "when one process catches the GPU OOM exception and skips the batch (optimizer.zero_grad()), the "
               "others get blocked (distilled: the OOM is raised by a layer on rank 1's one oversized batch).",
    "family": "exception",
    "world_size": 2,
    "kind": "caught_exception",
    "ranks": [1],
    "line": "oom_except",
    "fix": ["skip together", "all_reduce a flag", "zero the loss"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class MemoryHungry(nn.Module):
    """Stands in for a layer whose activations do not fit on the device when the batch is too long."""

    def forward(self, x):
        if x.numel() > 4096:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 15.78 GiB total capacity)")
        return x


def train_loader(rank):
    generator = torch.Generator().manual_seed(rank)
    for index in range(6):
        rows = 1024 if (rank == 1 and index == 2) else 32  # a bucketed sampler: rank 1 draws one huge batch
        yield torch.randn(rows, 8, generator=generator), torch.randint(0, 2, (rows,), generator=generator)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), MemoryHungry(),
                                                  nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (inputs, targets) in enumerate(train_loader(rank)):
        try:
            mark()
            loss = nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        except RuntimeError as e:  # LINE:oom_except
            if "out of memory" in str(e):
                print("| WARNING: ran out of memory, skipping this batch.", file=sys.stderr, flush=True)
                optimizer.zero_grad()
            else:
                raise e
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
