"""pytorch/examples tensor_parallel_example: ColwiseParallel then RowwiseParallel on a toy MLP, a CPU mesh; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/examples/blob/main/distributed/tensor_parallelism/tensor_parallel_example.py",
    "summary": "The TP example parallelizes a two-layer MLP Megatron style with parallelize_module: in_proj "
    "ColwiseParallel, out_proj RowwiseParallel, so the only forward collective is the all-reduce after "
    "out_proj. Every iteration seeds the input identically on all ranks (TP needs the same input everywhere) "
    "and runs forward, backward (of a squared-output loss) and AdamW; the DTensor collectives match on every "
    "rank: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = ToyModel()
    model = parallelize_module(model, mesh, {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, foreach=True)
    for i in range(6):
        torch.manual_seed(i)  # TP: the same input on every rank, as a seeded data loader would give
        inp = torch.rand(20, 10)
        out = model(inp)
        loss = out.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"[rank{rank}] iter {i} loss {loss.item():.4f}")
    shard = model.in_proj.weight.to_local()
    full = model.in_proj.weight.full_tensor()  # all-gather of the column shards
    print(f"[rank{rank}] in_proj shard {tuple(shard.shape)} full {tuple(full.shape)} sum {full.sum().item():.4f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
