"""Ranks whose control flow departs on a rank-local value: `python departures.py CASE`; lines tagged `# LINE:`.

Early stopping on a local validation loss, a NaN check that returns, a caught exception that skips backward; none
of them is uneven data (every rank has the same number of batches per epoch).
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import ddpwatch


def loader(rank, batches=4, bad_batch=None):
    """This rank's own shard: `batches` batches of 8; with `bad_batch`, that batch holds a corrupt sample (inf)."""
    torch.manual_seed(rank)
    x, y = torch.randn(8 * batches, 4), torch.randn(8 * batches, 1)
    if bad_batch is not None:
        x[8 * bad_batch] = float("inf")
        y[8 * bad_batch] = float("nan")
    return DataLoader(TensorDataset(x, y), batch_size=8)


def bn_model():
    return DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)))


class EarlyStopping:
    def __init__(self, patience):
        self.patience, self.best, self.bad = patience, float("inf"), 0

    def should_stop(self, loss):
        if loss < self.best:
            self.best, self.bad = loss, 0
        else:
            self.bad += 1
        return self.bad >= self.patience


def local_val_loss(rank, epoch):
    """Each rank evaluates its own validation shard: rank 0's loss gets worse from epoch 1 on, rank 1's improves."""
    return 1.0 + epoch if rank == 0 else 1.0 / (epoch + 1)


def early_stop(rank):
    model = DistributedDataParallel(nn.Linear(4, 1))
    data = loader(rank)
    stopper = EarlyStopping(patience=1)
    for epoch in range(20):
        for x, y in data:
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()  # LINE:early_backward
        val_loss = local_val_loss(rank, epoch)
        if stopper.should_stop(val_loss):  # LINE:early_condition
            break  # LINE:early_break
    dist.barrier()  # LINE:early_barrier


def train_until_nan(model, data):
    for epoch in range(3):
        for x, y in data:
            loss = ((model(x) - y) ** 2).mean()  # LINE:nan_forward
            if not torch.isfinite(loss):  # LINE:nan_condition
                return  # LINE:nan_return
            loss.backward()  # LINE:nan_backward


def nan_return(rank):
    model = bn_model()
    train_until_nan(model, loader(rank, bad_batch=2 if rank == 1 else None))
    dist.barrier()  # LINE:nan_barrier


def checked_loss(out, y):
    if torch.isnan(y).any():
        raise ValueError("corrupt sample: NaN label")
    return ((out - y) ** 2).mean()


def caught(rank):
    model = bn_model()
    for x, y in loader(rank, bad_batch=2 if rank == 1 else None):
        try:
            loss = checked_loss(model(x), y)  # LINE:caught_forward
        except ValueError:  # LINE:caught_except
            continue  # LINE:caught_continue
        loss.backward()  # LINE:caught_backward
    dist.barrier()


CASES = {"early_stop": early_stop, "nan_return": nan_return, "caught": caught}


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    with ddpwatch.guard():
        dist.init_process_group("gloo")
        print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
        CASES[case](dist.get_rank())
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
