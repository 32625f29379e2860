"""Ranks whose control flow departs on a rank-local value: `python departures.py CASE`; lines tagged `# LINE:`.

Early stopping on a local validation loss (over a DataLoader, or loops over range()), a NaN
check that returns (in the loop, or in a helper whose None the caller skips on), a caught exception that skips
backward (at once, or with no buffers only at the loop's end), a crash handler that broadcasts, a metric helper that
returns on an empty shard; none of them is uneven data (every rank has the same number of batches per epoch).
"""

import os
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


EPOCHS = 10


def local_accuracy(rank):
    """Rank 1's validation shard holds only easy samples."""
    return 0.95 if rank == 1 else 0.5


def counted_stop(rank):
    """No DataLoader: loops over range() of constants, a break on a rank-local validation accuracy."""
    model = bn_model()
    generator = torch.Generator().manual_seed(rank)
    for epoch in range(EPOCHS):
        for step in range(3):
            model(torch.randn(8, 4, generator=generator)).sum().backward()  # LINE:counted_step
        val_acc = local_accuracy(rank)  # each rank's own validation shard
        if val_acc > 0.9:  # LINE:counted_condition
            break  # LINE:counted_break
    dist.barrier()


def decode(step, rank):
    if rank == 1 and step == 2:
        raise ValueError("could not decode sample: truncated record")
    return torch.randn(8, 4)


def train_steps(model, rank):
    for step in range(6):
        model(decode(step, rank)).sum().backward()  # LINE:handler_step


def save_checkpoint():
    names = [None]
    dist.broadcast_object_list(names, src=0)  # LINE:handler_broadcast


def handler(rank):
    """A crash checkpoint: the rank whose step raised saves, and the save broadcasts a file name."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    try:
        train_steps(model, rank)  # LINE:handler_try
    except ValueError:  # LINE:handler_except
        save_checkpoint()
        raise


def epoch_metric(values):
    if len(values) == 0:  # LINE:empty_condition
        return None  # LINE:empty_return
    dist.barrier()  # LINE:empty_sync
    total = torch.tensor([sum(values)])
    dist.all_reduce(total)
    return total.item()


def empty_shard(rank):
    """Rank 1's validation shard is empty: its metric helper returns before the metric's sync (a barrier, as
    torchmetrics' gather begins)."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    generator = torch.Generator().manual_seed(rank)
    validation = [0.5]  # one validation sample: the second rank's shard is empty
    for epoch in range(3):
        for step in range(2):
            model(torch.randn(8, 4, generator=generator)).sum().backward()  # LINE:empty_step
        epoch_metric(validation[rank::2])  # LINE:empty_call


def skip_unbuffered(rank):
    """No buffers: the skipped backward lets the next steps pair up, and the hang forms after the loop."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    for x, y in loader(rank, bad_batch=1 if rank == 1 else None):
        try:
            loss = checked_loss(model(x), y)
        except ValueError:  # LINE:unbuffered_except
            continue
        loss.backward()
    dist.barrier()


def training_step(model, x, y):
    loss = ((model(x) - y) ** 2).mean()
    if torch.isnan(loss):  # LINE:helper_condition
        return None  # LINE:helper_return
    return loss


def helper_none(rank):
    """training_step returns None on a NaN loss; the caller skips backward on that None."""
    model = bn_model()
    for x, y in loader(rank, bad_batch=2 if rank == 1 else None):
        loss = training_step(model, x, y)
        if loss is None:
            continue  # LINE:helper_continue
        loss.backward()
    dist.barrier()


def stop_then_empty_reduce(rank):
    """The counted early stop, then a reduction of what this rank gathered after its last epoch: nothing, an empty
    tensor, which gloo completes alone. The rank that broke is a position ahead when the hang forms."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    generator = torch.Generator().manual_seed(rank)
    for epoch in range(EPOCHS):
        for step in range(3):
            model(torch.randn(8, 4, generator=generator)).sum().backward()
        if local_val_loss(rank, epoch) > 1.5:  # LINE:ahead_condition
            break  # LINE:ahead_break
    pending = torch.zeros(0)  # the samples this rank held back when it stopped: none
    dist.all_reduce(pending)
    dist.barrier()


def manual_next(rank):
    """A loop over a hand-driven iterator that breaks on StopIteration: rank 0's shard holds one more batch than
    rank 1's. Running out of data is no swallowed error: the data are uneven (issue 40)."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    generator = torch.Generator().manual_seed(rank)
    batches = [torch.randn(8, 4, generator=generator) for _ in range(4 if rank == 0 else 3)]
    it = iter(batches)
    while True:
        try:
            x = next(it)  # LINE:manual_next
        except StopIteration:
            break
        model(x).sum().backward()  # LINE:manual_backward
    dist.barrier()  # LINE:manual_barrier


class PatienceMonitor:
    """A patience monitor as tutorials write it: the decision is an attribute the caller reads (`early_stop`)."""

    def __init__(self, patience):
        self.patience, self.counter, self.best, self.early_stop = patience, 0, None, False

    def __call__(self, val_loss):
        if self.best is None or val_loss < self.best:
            self.best, self.counter = val_loss, 0
        else:
            self.counter += 1
            if self.counter >= self.patience:
                self.early_stop = True


def patience_attribute(rank):
    """Issue 42 (a): each rank feeds its own validation loss to its own monitor, then `if stopper.early_stop: break`
    out of `for epoch in range(30)`; the best checkpoint is saved under a condition on the monitor and the rank."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    generator = torch.Generator().manual_seed(rank)
    stopper = PatienceMonitor(patience=2)
    for epoch in range(30):
        for step in range(3):
            model(torch.randn(8, 4, generator=generator)).sum().backward()  # LINE:patience_backward
        stopper(local_val_loss(rank, epoch))
        if stopper.counter == 0 and rank == 0:
            torch.save(model.module.state_dict(), os.devnull)
        if stopper.early_stop:
            break  # LINE:patience_break
    dist.barrier()


def stream(shard):
    while True:
        yield from shard


def time_budget(rank):
    """Each rank's own budget, as a job reads it from its node's scheduler allocation: rank 1's node has 1 s left."""
    return 1.0 if rank == 1 else 3600.0


def wall_clock_budget(rank):
    """Issue 42 (b): a per-rank wall-clock budget over an endless stream from a generator function; rank 1's is
    spent first and it leaves while rank 0 trains on."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    generator = torch.Generator().manual_seed(rank)
    shard = [torch.randn(8, 4, generator=generator) for _ in range(3)]
    budget_s = time_budget(rank)
    start = time.monotonic()
    for x in stream(shard):
        model(x).sum().backward()  # LINE:budget_backward
        if time.monotonic() - start > budget_s:  # LINE:budget_condition
            break  # LINE:budget_break
    dist.barrier()


def named_stream(rank):
    """The budget again, the stream bound to a name first (`batches = stream(shard)`, `for x in batches:`): the loop's
    header names no generator, but the rank that left still holds it, suspended: observed, not read."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    generator = torch.Generator().manual_seed(rank)
    batches = stream([torch.randn(8, 4, generator=generator) for _ in range(3)])
    budget_s = time_budget(rank)
    start = time.monotonic()
    for x in batches:
        model(x).sum().backward()  # LINE:named_backward
        if time.monotonic() - start > budget_s:
            break  # LINE:named_break
    dist.barrier()


def named_iterator_runs_out(rank):
    """A named iterator over a list, rank 0's one batch longer, no exit in the loop: rank 1's ran out (observed:
    nothing left in it), so the data are uneven and rank 0, with the extra batch, is the culprit."""
    model = DistributedDataParallel(nn.Linear(4, 1))
    generator = torch.Generator().manual_seed(rank)
    batches = iter([torch.randn(8, 4, generator=generator) for _ in range(4 if rank == 0 else 3)])
    for x in batches:
        model(x).sum().backward()  # LINE:runs_out_backward
    dist.barrier()


def report_errors(rank, errors):
    """Send this rank's errors to rank 0, or nothing when it has none (the bug: rank 0 waits for every rank)."""
    if not errors:
        return  # LINE:p2p_early_return
    dist.send(torch.tensor([len(errors)]), dst=0)  # LINE:p2p_send


def p2p_helper_return(rank):
    """Issue 42: a helper returns before its send on a rank with nothing to contribute, while rank 0 loops over
    recv(src=r) for every rank."""
    errors = [] if rank == 1 else ["bad sample"]
    if rank == 0:
        for source in range(1, dist.get_world_size()):
            count = torch.zeros(1, dtype=torch.long)
            dist.recv(count, src=source)  # LINE:p2p_recv
    else:
        report_errors(rank, errors)
    dist.barrier()


CASES = {"early_stop": early_stop, "nan_return": nan_return, "caught": caught, "counted_stop": counted_stop,
         "handler": handler, "empty_shard": empty_shard,
         "skip_unbuffered": skip_unbuffered, "helper_none": helper_none,
         "stop_then_empty_reduce": stop_then_empty_reduce, "manual_next": manual_next,
         "patience_attribute": patience_attribute, "wall_clock_budget": wall_clock_budget,
         "p2p_helper_return": p2p_helper_return, "named_stream": named_stream,
         "named_iterator_runs_out": named_iterator_runs_out}


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
