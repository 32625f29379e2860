"""discuss.pytorch.org 'wait vs barrier': async all_reduces, overlapped compute, wait on all handles later; correct."""

EXPECT = {
    "source": "https://discuss.pytorch.org/t/what-is-the-difference-between-wait-and-barrier-in-torch-distributed/129720",
    "summary": "The thread explains that all_reduce(..., async_op=True) followed by handle.wait() is equivalent to "
    "the blocking call, and that the point of the async form is to put other work before wait() to "
    "overlap communication and computation. Here each step launches one async all_reduce per gradient, "
    "prepares the next batch and a local metric meanwhile, then waits on every handle before the "
    "optimizer step: all ranks issue the same all-reduces in the same order.",
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


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(rank)
    batch = torch.randn(32, 16)
    running = 0.0
    for step in range(6):
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        handles = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
        # overlap: prepare the next batch and a local metric while the all-reduces are in flight
        next_batch = torch.randn(32, 16)
        next_batch = (next_batch - next_batch.mean(0)) / next_batch.std(0)
        running = 0.9 * running + 0.1 * loss.item()
        for handle in handles:
            handle.wait()
        for p in model.parameters():
            p.grad /= world
        optimizer.step()
        batch = next_batch
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    print(f"[rank{rank}] running loss {running:.4f} params checksum {checksum:.4f}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
