"""PyTorch DCP async checkpoint recipe: async_save runs collectives on its own group in a background thread; correct."""

EXPECT = {
    "source": "https://docs.pytorch.org/tutorials/recipes/distributed_async_checkpoint_recipe.html",
    "summary": "The 'Asynchronous Saving with Distributed Checkpoint (DCP)' recipe creates an extra process group "
    "for the checkpoint collectives and calls dcp.async_save(..., process_group=checkpoint_group) every "
    "few steps, waiting on the previous future before starting the next save. The save's planning "
    "collectives run in a background thread on the checkpoint group while the main thread keeps "
    "training with DDP on the default group; each group keeps one order on every rank.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import os
import shutil
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # additional process group for the asynchronous checkpoint collectives
    checkpoint_group = dist.new_group(list(range(world)), backend="gloo", timeout=timedelta(minutes=5))
    ckpt_root = os.path.join(tempfile.gettempdir(), f"dcp_async_{os.environ['MASTER_PORT']}")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(rank)
    checkpoint_future = None
    for step in range(6):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 2 == 1:
            if checkpoint_future is not None:
                checkpoint_future.result()  # at most one save in flight
            state_dict = {"model": model.module.state_dict()}
            checkpoint_future = dcp.async_save(
                state_dict, checkpoint_id=os.path.join(ckpt_root, f"step{step}"), process_group=checkpoint_group
            )
    checkpoint_future.result()
    restored = {"model": {k: torch.zeros_like(v) for k, v in model.module.state_dict().items()}}
    dcp.load(restored, checkpoint_id=os.path.join(ckpt_root, "step5"))
    checksum = sum(v.sum().item() for v in restored["model"].values())
    print(f"[rank{rank}] loss {loss.item():.4f} restored checksum {checksum:.4f}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_root, ignore_errors=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
