"""torchtitan _dist_reduce_tensor: chained functional all_reduces (extra_pg, mesh), one wait_tensor; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/torchtitan/blob/main/torchtitan/distributed/utils.py",
    "summary": "torchtitan's _dist_reduce_tensor issues funcol.all_reduce on an extra process group (the "
    "fault-tolerance replica group) and then, on the not-yet-waited result, funcol.all_reduce on the mesh, "
    "and calls funcol.wait_tensor once at the end. This program logs the loss that way every other step, "
    "and also issues a funcol.all_gather_tensor of per-rank token counts before the optimizer step and waits "
    "on it afterwards (overlap). All ranks issue the same functional collectives in the same order: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import datetime

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel


def dist_reduce_tensor(x, op, mesh, extra_pg):
    x = funcol.all_reduce(x, reduceOp=op, group=extra_pg)  # not waited yet
    x = funcol.all_reduce(x, reduceOp=op, group=mesh)  # chained on the pending result
    return funcol.wait_tensor(x)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    extra_pg = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))  # replica group
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, 7):
        n_tokens = 4 + rank + step % 3
        x = torch.randn(n_tokens, 8, generator=gen)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        counts = funcol.all_gather_tensor(torch.tensor([n_tokens]), gather_dim=0, group=mesh)  # async
        optimizer.step()  # overlaps with the gather
        counts = funcol.wait_tensor(counts).tolist()
        if step % 2 == 0:  # log_freq: the same steps on every rank
            local = loss.detach()
            global_sum = dist_reduce_tensor(local, "sum", mesh, extra_pg).item()
            global_max = dist_reduce_tensor(local, "max", mesh, extra_pg).item()
            print(
                f"[rank{rank}] step {step} loss {local.item():.4f} sum {global_sum:.4f} "
                f"max {global_max:.4f} tokens {counts}"
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
