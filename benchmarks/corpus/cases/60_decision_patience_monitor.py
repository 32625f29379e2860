"""speechbrain/speechbrain#1939: a patience monitor fed each rank's own validation loss stops one rank's epoch loop."""

EXPECT = {
    "source": "https://github.com/speechbrain/speechbrain/issues/1939",
    "summary": "'DDP with epochCounterWithStopper leads to CUDA timeouts': the reporter calls the epoch counter's "
               "should_stop() with each GPU's own validation metric and sees an all-reduce watchdog timeout "
               "'when one GPU hits a early stop while the other does not' (distilled to plain DDP: a patience "
               "monitor object fed each rank's local validation loss, `if stopper.early_stop: break` out of "
               "the epoch loop, and a best-checkpoint save on rank 0 while the monitor improves).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [0],
    "line": "patience_break",
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

W_TRUE = torch.tensor([[1.5], [-2.0], [0.5], [1.0], [0.0], [-1.0], [2.0], [0.25]])


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class EarlyStopping:
    """Stops training if the validation loss does not improve for `patience` epochs in a row."""

    def __init__(self, patience=3, delta=0.0):
        self.patience = patience
        self.delta = delta
        self.counter = 0
        self.best_loss = None
        self.early_stop = False

    def __call__(self, val_loss):
        if self.best_loss is None or val_loss < self.best_loss - self.delta:
            self.best_loss = val_loss
            self.counter = 0
        else:
            self.counter += 1
            if self.counter >= self.patience:
                self.early_stop = True


def validation_shard(rank, generator):
    # Each rank validates on its own shard; rank 0's shard comes from another site whose labels are flipped.
    x = torch.randn(64, 8, generator=generator)
    y = x @ W_TRUE
    return (x, -y) if rank == 0 else (x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    generator = torch.Generator().manual_seed(100 + rank)
    val_x, val_y = validation_shard(rank, generator)
    stopper = EarlyStopping(patience=3)
    checkpoint = os.path.join(tempfile.gettempdir(), f"corpus-60-best-{os.getpid()}.pt")
    for epoch in range(30):
        model.train()
        for _ in range(4):
            x = torch.randn(16, 8, generator=generator)
            mark()
            loss = nn.functional.mse_loss(model(x), x @ W_TRUE)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(model.module(val_x), val_y).item()
        stopper(val_loss)
        print(f"[rank{rank}] epoch {epoch} val_loss {val_loss:.3f} patience {stopper.counter}", file=sys.stderr,
              flush=True)
        if rank == 0 and stopper.counter == 0:
            torch.save(model.module.state_dict(), checkpoint)  # the best model so far
        if stopper.early_stop:
            print(f"[rank{rank}] early stopping at epoch {epoch}", file=sys.stderr, flush=True)
            break  # LINE:patience_break
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
