"""Lightning Fabric docs (distributed communication): all_reduce, barrier, save under an external launcher; correct."""

EXPECT = {
    "source": "https://lightning.ai/docs/fabric/stable/advanced/distributed_communication.html",
    "summary": "Fabric's communication guide: every process calls fabric.all_reduce / fabric.barrier, and work done "
    "on one rank (downloads, writes) is fenced by a barrier. Here the processes are started by an external "
    "launcher (LOCAL_RANK set), so Fabric(strategy='ddp', devices=WORLD_SIZE).launch() joins them instead of "
    "spawning; the loop trains with fabric.backward, all-reduces the epoch loss on every rank, and saves with "
    "fabric.save (all ranks call it, rank 0 writes) followed by a barrier: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import logging
import os
import shutil
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


def main():
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    fabric = Fabric(
        accelerator="cpu", strategy=DDPStrategy(process_group_backend="gloo"), devices=int(os.environ["WORLD_SIZE"])
    )
    fabric.launch()  # LOCAL_RANK is set: no processes are spawned, this one joins the group
    rank = fabric.global_rank
    fabric.seed_everything(0, verbose=False)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(48, 8, generator=gen)
    data = fabric.setup_dataloaders(DataLoader(TensorDataset(x, x.mean(dim=1, keepdim=True)), batch_size=6))

    folder = fabric.broadcast(tempfile.mkdtemp(prefix="fabric_ckpt_") if rank == 0 else None, src=0)
    for epoch in range(2):
        total = torch.zeros(())
        for xb, yb in data:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            total += loss.detach()
        mean = fabric.all_reduce(total / len(data), reduce_op="mean")  # every rank
        fabric.print(f"epoch {epoch} mean loss {mean.item():.4f}")  # prints on rank 0 only
        print(f"[rank{rank}] epoch {epoch} local {total.item() / len(data):.4f} global {mean.item():.4f}")
        state = {"model": model, "optimizer": optimizer, "epoch": epoch}
        fabric.save(os.path.join(folder, f"epoch{epoch}.ckpt"), state)  # collective call, rank 0 writes
        fabric.barrier()
    if rank == 0:
        print(f"[rank{rank}] files {sorted(os.listdir(folder))}")
        shutil.rmtree(folder)
    fabric.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
