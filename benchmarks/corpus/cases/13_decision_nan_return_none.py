"""Lightning-AI/pytorch-lightning#5243: training_step returns None on a NaN loss; that rank skips the backward."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/pytorch-lightning/issues/5243",
    "summary": "'Returning None from training_step with multi GPU DDP training freezes the training without "
               "exception' (training_step returns None when torch.isnan(loss)). Distilled to plain DDP: "
               "Lightning 2.6 now raises 'Skipping the training_step by returning None in distributed training "
               "is not supported' instead of hanging.",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [1],
    "line": "nan_return",
    "fix": ["all_reduce", "skip together", "zero the loss"],
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


def training_step(model, batch):
    data, target = batch
    loss = nn.functional.mse_loss(model(data), target)
    if torch.isnan(loss):
        return None  # LINE:nan_return
    return loss


def batches(rank):
    generator = torch.Generator().manual_seed(rank)
    for index in range(6):
        data, target = torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator)
        if rank == 1 and index == 2:
            target[0] = float("nan")  # one corrupt label in rank 1's shard
        yield data, target


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # BatchNorm: DDP's forward broadcasts its buffers, so the skipped backward shows at the very next step.
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in batches(rank):
        mark()
        loss = training_step(model, batch)
        if loss is None:  # what the trainer did with a None: skip backward and the optimizer step
            continue
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
