"""Lightning Timer callback: each rank checks its clock, rank 0's answer is broadcast, all stop together; correct."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/pytorch-lightning/blob/3f4c0445bdd5716049a90541880f7dcbe7fb8c3a/src/lightning/pytorch/callbacks/timer.py",  # noqa: E501
    "summary": "Timer._check_time_remaining runs after every training batch on every rank: it computes "
    "should_stop from the elapsed time, then should_stop = trainer.strategy.broadcast(should_stop), "
    "which for DDP is broadcast_object_list from rank 0, so rank 0's clock decides for everyone and all "
    "ranks leave the loop after the same batch even though their own clocks disagree.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def strategy_broadcast(obj, src=0):
    """DDPStrategy.broadcast."""
    obj = [obj]
    dist.broadcast_object_list(obj, src)
    return obj[0]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    duration = 1.0
    start = time.monotonic()
    step = 0
    while step < 1000:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.1 if rank == 0 else 0.15)  # the ranks' clocks run differently
        step += 1
        should_stop = time.monotonic() - start >= duration  # on_train_batch_end -> _check_time_remaining
        should_stop = strategy_broadcast(should_stop)
        if should_stop:
            break
    steps = torch.tensor([step, -step])
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    print(
        f"[rank{rank}] stopped by the timer: {step < 1000}, same step on all ranks: {bool(steps[0] == -steps[1])}",
        flush=True,
    )
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
