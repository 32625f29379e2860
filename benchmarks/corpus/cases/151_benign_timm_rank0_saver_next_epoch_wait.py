"""timm train.py: the CheckpointSaver exists on rank 0 only; the others wait in the next epoch's all-reduce; correct."""

EXPECT = {
    "source": "https://github.com/huggingface/pytorch-image-models/blob/main/train.py",
    "summary": "timm's train.py builds the CheckpointSaver only on the primary rank; each epoch every rank trains "
    "(DDP), reduces BatchNorm statistics (distribute_bn) and validates with all-reduced metrics, then only "
    "rank 0 runs saver.save_checkpoint. The other ranks go straight on and wait for rank 0 inside the next "
    "epoch's first gradient all-reduce (and at the final barrier after the last save). Here the save is a "
    "few-MB torch.save plus a 1.5 s pause (a slow disk); every collective is matched: correct.",
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
from torch.nn.parallel import DistributedDataParallel


class CheckpointSaver:
    def __init__(self, folder):
        self.folder = folder
        self.best = None

    def save_checkpoint(self, epoch, model, optimizer, metric):
        state = {
            "epoch": epoch,
            "state_dict": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "metric": metric,
            "extra": torch.zeros(1_000_000),  # a few MB, like EMA weights and optimizer moments
        }
        torch.save(state, os.path.join(self.folder, "last.pth.tar"))
        time.sleep(1.5)  # slow (network) filesystem
        if self.best is None or metric < self.best[1]:
            shutil.copyfile(os.path.join(self.folder, "last.pth.tar"), os.path.join(self.folder, "model_best.pth.tar"))
            self.best = (epoch, metric)
        return self.best


def distribute_bn(model, world):
    for name, buf in model.module.named_buffers():
        if "running_mean" in name or "running_var" in name:
            dist.all_reduce(buf)
            buf /= world


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 4))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    saver = CheckpointSaver(tempfile.mkdtemp(prefix="timm_out_")) if rank == 0 else None  # primary only
    gen = torch.Generator().manual_seed(rank)
    for epoch in range(3):
        model.train()
        for _ in range(4):
            x = torch.randn(8, 12, generator=gen)
            loss = nn.functional.cross_entropy(model(x), x[:, :4].argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()  # epochs 1 and 2: rank 1 waits here while rank 0 is still saving
            optimizer.step()
        distribute_bn(model, world)
        model.eval()
        with torch.no_grad():
            x = torch.randn(16, 12, generator=gen)
            val_loss = nn.functional.cross_entropy(model(x), x[:, :4].argmax(dim=1))
        dist.all_reduce(val_loss)  # reduce_tensor in timm's validate()
        val_loss = val_loss.item() / world
        print(f"[rank{rank}] epoch {epoch} val_loss {val_loss:.4f}")
        if saver is not None:
            best_epoch, best_metric = saver.save_checkpoint(epoch, model, optimizer, val_loss)
            print(f"[rank{rank}] saved epoch {epoch}, best epoch {best_epoch} ({best_metric:.4f})")
    dist.barrier()  # the last save finishes before anyone exits
    if saver is not None:
        shutil.rmtree(saver.folder)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
