"""pytorch/pytorch#125177 (fixed): rank 0 alone loads a full checkpoint, broadcast_from_rank0 shards it; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/125177",
    "summary": "'Can't load on rank 0 only with set_optimizer_state_dict': to avoid CPU OOMs, training libraries "
    "load a monolithic checkpoint on rank 0 only and pass empty dicts elsewhere; set_model_state_dict / "
    "set_optimizer_state_dict with StateDictOptions(full_state_dict=True, broadcast_from_rank0=True) then "
    "broadcast every tensor from rank 0 and each rank keeps its shard. Here rank 0 spends a moment reading "
    "the file while rank 1 waits in the first broadcast; every rank calls both setters: correct.",
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

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def build(mesh):
    model = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 2))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(model, optim, gen, steps):
    for _ in range(steps):
        x = torch.randn(6, 10, generator=gen)
        loss = (model(x) - x[:, :2]).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
    return loss.item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    gen = torch.Generator().manual_seed(40 + rank)
    torch.manual_seed(0)
    model, optim = build(mesh)
    train(model, optim, gen, 3)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    trained = sum(p.full_tensor().double().sum().item() for p in model.parameters())
    model_sd = get_model_state_dict(model, options=full)  # collectives: all ranks; full dicts on rank 0 only
    optim_sd = get_optimizer_state_dict(model, optim, options=full)
    folder = tempfile.mkdtemp(prefix="rank0_ckpt_") if rank == 0 else None
    if rank == 0:
        torch.save({"model": model_sd, "optim": optim_sd}, os.path.join(folder, "full.pt"))

    torch.manual_seed(123)  # a fresh model with different weights, as after a restart
    model, optim = build(mesh)
    if rank == 0:
        time.sleep(1.5)  # reading a big monolithic checkpoint from a slow disk
        loaded = torch.load(os.path.join(folder, "full.pt"), weights_only=True)
        model_sd, optim_sd = loaded["model"], loaded["optim"]
        shutil.rmtree(folder)
    else:
        model_sd, optim_sd = {}, {}  # nothing read here: rank 0 broadcasts
    bcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, model_sd, options=bcast)  # rank 1 waits here for rank 0's read
    set_optimizer_state_dict(model, optim, optim_sd, options=bcast)
    checksum = sum(p.full_tensor().double().sum().item() for p in model.parameters())
    print(f"[rank{rank}] trained checksum {trained:.5f} restored checksum {checksum:.5f}")
    loss = train(model, optim, gen, 2)
    print(f"[rank{rank}] resumed training, last loss {loss:.4f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
