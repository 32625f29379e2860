"""pytorch/tutorials distributed_checkpoint_recipe: DCP save then load of a DDP model+optimizer; correct."""

EXPECT = {
    "source": "https://docs.pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html",
    "summary": "'Getting Started with Distributed Checkpoint (DCP)': every rank calls dcp.save() on an AppState "
    "(a Stateful wrapping get_state_dict/set_state_dict of model and optimizer), and later dcp.load() into "
    "a freshly built model, in place; both calls are collectives (planning is gathered to the coordinator, "
    "rank 0). A correct program: rank 0 makes a temp dir and broadcasts its path, all ranks save and load "
    "it, and the reloaded DDP model equals the saved one on every rank.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP


class AppState(Stateful):
    """Wraps model and optimizer so DCP calls state_dict/load_state_dict on them."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self):
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizer)
        return {"model": model_state_dict, "optim": optimizer_state_dict}

    def load_state_dict(self, state_dict):
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )


def build(seed):
    torch.manual_seed(seed)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    holder = [tempfile.mkdtemp(prefix="dcp_") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    checkpoint_dir = holder[0]

    model, optimizer = build(seed=0)
    torch.manual_seed(71 + rank)
    for step in range(3):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    saved = sum(p.detach().sum().item() for p in model.parameters())
    dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=checkpoint_dir)

    fresh_model, fresh_optimizer = build(seed=1)  # different weights until the load
    dcp.load({"app": AppState(fresh_model, fresh_optimizer)}, checkpoint_id=checkpoint_dir)
    loaded = sum(p.detach().sum().item() for p in fresh_model.parameters())
    print(f"[rank{rank}] saved checksum {saved:.5f} loaded checksum {loaded:.5f}", flush=True)

    dist.barrier()  # nobody reads the directory any more
    if rank == 0:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
