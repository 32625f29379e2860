"""Lightning-AI/pytorch-lightning#6430: the rank that raised goes into the crash-checkpoint flow and its broadcast."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/pytorch-lightning/issues/6430",
    "summary": "'Expected behavior when 1 rank crashes in distributed training?': the train loop is wrapped in a "
               "try/catch that checkpoints if anything fails, so the one rank that raised goes through the "
               "checkpointing flow and hangs broadcasting the filename, which obscures the real error "
               "(distilled to plain DDP).",
    "family": "exception",
    "world_size": 2,
    "kind": "caught_exception",
    "ranks": [1],
    "line": "crash_except",
    "fix": ["all_reduce a flag", "every rank", "skip together"],
}

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def mark():
    # Printed before every collective this rank reaches: the last one printed is where it blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def decode(sample_id, rank):
    if rank == 1 and sample_id == 17:
        raise ValueError(f"could not decode sample {sample_id}: truncated record")
    return torch.randn(8, 4), torch.randn(8, 1)


def train(model, optimizer, rank):
    for step in range(6):
        data, target = decode(sample_id=8 * step + rank, rank=rank)
        mark()
        loss = nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def save_checkpoint(model, rank):
    # Rank 0 picks the file name and broadcasts it so that every rank writes to the same place.
    names = [os.path.join(tempfile.gettempdir(), f"corpus-crash-{int(time.time())}.ckpt")] if rank == 0 else [None]
    mark()
    dist.broadcast_object_list(names, src=0)
    if rank == 0:
        torch.save(model.state_dict(), names[0])


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        train(model, optimizer, rank)
    except Exception:  # LINE:crash_except
        print(f"[rank{rank}] training failed; saving a checkpoint before exiting", file=sys.stderr, flush=True)
        save_checkpoint(model, rank)
        raise
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
