"""jpata/particleflow#233: rank-0 validation through model.module each epoch, then a barrier; correct."""

EXPECT = {
    "source": "https://github.com/jpata/particleflow/pull/233",
    "summary": "'fix pytorch multi-GPU training hang': validation runs on one GPU only, so its forward pass "
    "must use model.module() instead of the DDP model(), which would enter collectives the other ranks "
    "never join; all ranks then meet at dist.barrier(). A correct program: a BatchNorm model trains under "
    "DDP (buffers broadcast from rank 0 at each forward; SyncBatchNorm cannot train on CPU), rank 0 "
    "validates on a fixed-seed set via model.module for about a second per epoch while rank 1 waits.",
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
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
    model = DDP(net)  # broadcast_buffers=True: rank 0's BatchNorm running stats are sent at every forward
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1234)  # the same validation set every epoch
    x_val, y_val = torch.randn(64, 10, generator=g), torch.randn(64, 1, generator=g)
    torch.manual_seed(81 + rank)
    for epoch in range(3):
        model.train()
        for step in range(4):
            x, y = torch.randn(16, 10), torch.randn(16, 1)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            model.eval()
            with torch.no_grad():
                # model.module: the plain module, no DDP hooks or collectives on this rank-only path.
                val_loss = nn.functional.mse_loss(model.module(x_val), y_val).item()
            time.sleep(1.0)  # metrics, logging, plots: rank 1 waits at the barrier
            print(f"[rank0] epoch {epoch} val loss {val_loss:.5f}", flush=True)
            model.train()
        dist.barrier()
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    print(f"[rank{rank}] param checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
