"""ultralytics/yolov5#4576: `stop = stopper(epoch, fitness)` is computed on rank 0 only, so only rank 0 breaks."""

EXPECT = {
    "source": "https://github.com/ultralytics/yolov5/pull/4576",
    "summary": "'Add EarlyStopping feature': 'Testing shows EarlyStopping works correctly on Single-GPU but not "
               "on DDP. My PR fails to broadcast the `stop` variable from RANK 0 to the rest of the ranks, "
               "resulting in the train loop breaking only for RANK 0, and then training hangs.' (distilled: "
               "rank 0 validates and asks the EarlyStopping helper, which returns a boolean; every rank then "
               "tests its own `stop`).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [0],
    "line": "stopper_break",
    "fix": ["broadcast", "all_reduce"],
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


class EarlyStopping:
    """YOLOv5's simple early stopper: True once fitness has not improved for `patience` epochs."""

    def __init__(self, patience=30):
        self.best_fitness = 0.0
        self.best_epoch = 0
        self.patience = patience or float("inf")

    def __call__(self, epoch, fitness):
        if fitness >= self.best_fitness:
            self.best_epoch = epoch
            self.best_fitness = fitness
        stop = (epoch - self.best_epoch) >= self.patience
        if stop:
            print(f"Stopping training early as no improvement observed in last {self.patience} epochs. "
                  f"Best results observed at epoch {self.best_epoch}.", file=sys.stderr, flush=True)
        return stop


def fitness(module, val_x, val_y):
    with torch.no_grad():
        return (module(val_x).argmax(1) == val_y).float().mean().item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                                  nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    generator = torch.Generator().manual_seed(rank)
    val_x = torch.randn(128, 8, generator=torch.Generator().manual_seed(99))
    val_y = (val_x[:, 0] < 0).long()  # the held-out set is labelled the other way round: fitness only drops
    stopper, stop = EarlyStopping(patience=3), False
    for epoch in range(30):
        model.train()
        for _ in range(4):
            x = torch.randn(32, 8, generator=generator)
            mark()
            loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank in (-1, 0):  # validation, plots and checkpoints on the main process only
            model.eval()
            fi = fitness(model.module, val_x, val_y)
            print(f"epoch {epoch}: fitness {fi:.3f}", file=sys.stderr, flush=True)
            stop = stopper(epoch=epoch, fitness=fi)
        if stop:
            break  # LINE:stopper_break
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
