"""PyTorch DTensor docs: distribute_tensor, sharded compute, redistribute Shard->Replicate, Partial sum; correct."""

EXPECT = {
    "source": "https://docs.pytorch.org/docs/stable/distributed.tensor.html",
    "summary": "The DTensor docs' SPMD model: distribute_tensor scatters a tensor over a DeviceMesh with a Shard or "
    "Replicate placement, operators run on local shards and insert the collectives they need, and "
    "redistribute changes placements (Shard -> Replicate is an all-gather, Partial -> Replicate an "
    "all-reduce). Every rank executes the same DTensor program, so the implicit collectives match: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the same full tensors on every rank (distribute_tensor uses rank 0's by default)
    big = torch.randn(8, 6)
    weight = torch.randn(6, 4)
    rows = distribute_tensor(big, mesh, [Shard(0)])  # each rank keeps 8 / world rows
    w = distribute_tensor(weight, mesh, [Replicate()])
    out = torch.relu(rows @ w)  # local matmul, output stays row-sharded
    print(f"[rank{rank}] local rows {tuple(rows.to_local().shape)} out placements {out.placements}")
    full = out.redistribute(mesh, [Replicate()])  # all-gather
    print(f"[rank{rank}] replicated out sum {full.to_local().sum().item():.4f}")
    col_sum = out.sum(dim=0)  # reduction over the sharded dim: a Partial result
    total = col_sum.redistribute(mesh, [Replicate()])  # all-reduce
    print(f"[rank{rank}] column sums {[round(v, 4) for v in total.to_local().tolist()]}")
    local = torch.full((2,), float(rank + 1))
    partial = DTensor.from_local(local, mesh, [Partial()])  # each rank holds a summand
    print(f"[rank{rank}] partial->replicate {partial.full_tensor().tolist()}")
    expected = torch.relu(big @ weight)
    print(f"[rank{rank}] matches single-process result {torch.allclose(full.to_local(), expected, atol=1e-5)}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
