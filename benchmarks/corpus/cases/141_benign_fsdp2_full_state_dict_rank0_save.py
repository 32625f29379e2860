"""pytorch/examples FSDP2 Checkpointer: gather a full state dict on all ranks, torch.save it on rank 0; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/examples/blob/main/distributed/FSDP2/checkpoint.py",
    "summary": "The FSDP2 example's Checkpointer gathers full model and optimizer state dicts with "
    "get_model_state_dict / get_optimizer_state_dict(StateDictOptions(full_state_dict=True, cpu_offload=True)) "
    "on EVERY rank (each gather is a collective), and only rank 0 writes them with torch.save. Here the "
    "layers keep their parameters unsharded after forward (reshard_after_forward=False) and the gradient "
    "divide factor is 1 (the loss is normalised by the global token count), as torchtitan configures it; "
    "all ranks call the gathers, rank 0 saves, then all meet at a barrier: correct.",
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

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh)
    model.set_gradient_divide_factor(1.0)  # the loss below is already divided by the global number of samples
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(7 + rank)
    for step in range(4):
        x = torch.randn(6, 16, generator=gen)
        y = torch.randn(6, 4, generator=gen)
        n_global = torch.tensor(float(x.shape[0]))
        dist.all_reduce(n_global)
        loss = (model(x) - y).pow(2).sum() / n_global
        loss.backward()
        optim.step()
        optim.zero_grad()
        print(f"[rank{rank}] step {step} local loss {loss.item():.4f}")

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=options)  # collective: every rank takes part
    optim_sd = get_optimizer_state_dict(model, optim, options=options)
    if rank == 0:
        folder = tempfile.mkdtemp(prefix="fsdp2_ckpt_")
        torch.save(model_sd, os.path.join(folder, "model_state_dict.pt"))
        torch.save(optim_sd, os.path.join(folder, "optim_state_dict.pt"))
        checksum = sum(t.double().sum().item() for t in model_sd.values())
        print(f"[rank{rank}] saved {len(model_sd)} tensors, checksum {checksum:.4f}")
        shutil.rmtree(folder)
    else:
        print(f"[rank{rank}] full state dict entries here: {len(model_sd)}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
