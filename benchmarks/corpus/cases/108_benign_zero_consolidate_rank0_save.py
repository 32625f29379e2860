"""torch ZeroRedundancyOptimizer docs: train, consolidate_state_dict(to=0) on all ranks, rank 0 saves; correct."""

EXPECT = {
    "source": "https://pytorch.org/docs/1.10/distributed.optim.html",
    "summary": "ZeroRedundancyOptimizer shards Adam's state across the DDP ranks and broadcasts each rank's "
    "updated shard after step(). To checkpoint it, consolidate_state_dict(to=0) must be called on every "
    "rank (it is a collective that gathers the shards on rank 0), then only rank 0 calls state_dict() and "
    "saves. A correct program: both ranks consolidate, rank 0 writes for about a second, and the others "
    "wait at the barrier after the save.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)], nn.Linear(32, 1))
    ddp_model = DDP(model)
    optimizer = ZeroRedundancyOptimizer(ddp_model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    torch.manual_seed(51 + rank)
    for step in range(4):
        outputs = ddp_model(torch.randn(20, 32))
        labels = torch.randn(20, 1)
        loss = nn.functional.mse_loss(outputs, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    # Every rank takes part in the consolidation; only the target rank ends up with the full state.
    optimizer.consolidate_state_dict(to=0)
    path = os.path.join(tempfile.gettempdir(), f"zero_ckpt_{os.environ['MASTER_PORT']}.pt")
    if rank == 0:
        state = {"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, path)
        time.sleep(1.0)  # a slow write; rank 1 waits at the barrier below
        n_states = len(state["optimizer"]["state"])
        print(f"[rank{rank}] saved optimizer state for {n_states} parameters", flush=True)
    dist.barrier()
    if rank == 0:
        os.remove(path)
    checksum = sum(p.detach().sum().item() for p in ddp_model.parameters())
    print(f"[rank{rank}] last loss {loss.item():.5f} param checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
