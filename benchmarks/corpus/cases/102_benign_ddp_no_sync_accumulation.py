"""pytorch/pytorch#21736: gradient accumulation under DDP.no_sync(), all-reduce every k-th step only; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/pull/21736",
    "summary": "The PR that added DistributedDataParallel.no_sync(): inside the context DDP skips the gradient "
    "all-reduce so gradients accumulate locally, and the next backward outside it synchronizes the "
    "accumulated gradients before optimizer.step(). A correct program: every rank uses the same "
    "accumulation schedule (sync on every 4th micro-batch), so each sync backward is matched on all ranks.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    accumulation_steps = 4
    torch.manual_seed(100 + rank)
    micro_batches = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range(12)]
    updates = 0
    for i, (x, y) in enumerate(micro_batches):
        sync_now = (i + 1) % accumulation_steps == 0
        # Accumulate locally on the first k-1 micro-batches; the k-th backward all-reduces the sum.
        ctx = contextlib.nullcontext() if sync_now else ddp.no_sync()
        with ctx:
            loss = nn.functional.mse_loss(ddp(x), y) / accumulation_steps
            loss.backward()
        if sync_now:
            optimizer.step()
            optimizer.zero_grad()
            updates += 1
    checksum = sum(p.detach().sum().item() for p in ddp.parameters())
    print(f"[rank{rank}] {updates} updates, param checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
