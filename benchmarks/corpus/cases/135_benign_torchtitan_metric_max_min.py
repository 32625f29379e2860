"""torchtitan metrics: dist_max / mean of the loss, an inf-norm grad clip with MAX, MIN and PRODUCT flags; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/torchtitan/blob/30b9ea0b1ad893379d2ff3b12dbf18600730c249/torchtitan/distributed/utils.py",  # noqa: E501
    "summary": "torchtitan's dist_max / dist_mean reduce a scalar loss over the mesh with functional all_reduce "
    "(ReduceOp.MAX / AVG) for logging, and clip_grad_norm_ all-reduces an inf-norm with ReduceOp.MAX. "
    "A correct program: every step all ranks log the global max and mean loss (AVG is NCCL-only, so "
    "SUM / world on gloo), clip with a MAX-reduced inf-norm, and reduce a MIN token count and a PRODUCT "
    "all-finite flag; several reduce sites, same order on every rank.",
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
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh


def dist_reduce(x, reduce_op, mesh):
    return funcol.all_reduce(x, reduceOp=reduce_op, group=mesh).item()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(rank)
    for step in range(4):
        n_tokens = 8 + 4 * rank + step
        loss = model(torch.randn(n_tokens, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        grad_inf = torch.stack([p.grad.abs().max() for p in model.parameters()]).max()
        dist.all_reduce(grad_inf, op=dist.ReduceOp.MAX)  # clip_grad_norm_ with norm_type=inf
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), 1.0, grad_inf)
        optimizer.step()
        global_max = dist_reduce(loss.detach(), "max", mesh)
        global_mean = dist_reduce(loss.detach(), "sum", mesh) / world
        min_tokens = torch.tensor([n_tokens])
        dist.all_reduce(min_tokens, op=dist.ReduceOp.MIN)
        finite = torch.tensor([float(torch.isfinite(loss).item())])
        dist.all_reduce(finite, op=dist.ReduceOp.PRODUCT)
        print(
            f"[rank{rank}] step {step} max {global_max:.4f} mean {global_mean:.4f} grad_inf {grad_inf.item():.4f} "
            f"min_tokens {int(min_tokens.item())} finite {bool(finite.item())}",
            flush=True,
        )
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
