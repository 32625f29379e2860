"""pytorch/torchtitan#292: FSDP2 gradient accumulation with set_requires_gradient_sync(is_last_microbatch); correct."""

EXPECT = {
    "source": "https://github.com/pytorch/torchtitan/issues/292",
    "summary": "'[Feature] Add gradient accumulation': FSDP2 replaced no_sync() with "
    "module.set_requires_gradient_sync(is_last_microbatch) at the top of the microbatch loop, so backward "
    "skips the reduce-scatter until the last microbatch (the forward all-gathers still run every time). "
    "Every rank runs the same number of microbatches and flips the flag on the same one, so the collectives "
    "match; the optimizer steps once per accumulation window: correct.",
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
from torch.distributed.fsdp import fully_shard


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 1))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(30 + rank)
    n_micro = 3
    for step in range(4):
        total = 0.0
        for micro in range(n_micro):
            is_last = micro == n_micro - 1
            model.set_requires_gradient_sync(is_last)  # recurses into every fully_shard'ed layer
            x = torch.randn(4, 12, generator=gen)
            loss = (model(x) - x[:, :1]).pow(2).mean() / n_micro
            loss.backward()
            total += loss.item()
        optim.step()
        optim.zero_grad()
        print(f"[rank{rank}] step {step} accumulated loss {total:.4f}")
    checksum = sum(p.full_tensor().double().sum().item() for p in model.parameters())  # all-gathers
    print(f"[rank{rank}] param checksum {checksum:.5f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
