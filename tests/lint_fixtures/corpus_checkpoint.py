"""Correct rank-0-only checkpointing, in the styles seen in trainers: guard, early return, helper function."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def is_dist_avail_and_initialized():
    return dist.is_available() and dist.is_initialized()


def get_rank():
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def is_main_process():
    return get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


class Trainer:
    def __init__(self, model, args):
        self.args = args
        self.model = DistributedDataParallel(model, device_ids=[args.local_rank])
        self.is_master = args.local_rank in [-1, 0]

    def save_checkpoint(self, epoch):
        if not self.is_master:
            return
        state = {"epoch": epoch, "model": self.model.module.state_dict()}
        torch.save(state, os.path.join(self.args.output_dir, f"epoch_{epoch}.pt"))

    def end_of_epoch(self, epoch):
        self.save_checkpoint(epoch)
        save_on_master(self.model.module.state_dict(), "latest.pt")
        if self.args.local_rank in [-1, 0]:
            print(f"saved epoch {epoch}")
        if is_dist_avail_and_initialized():
            dist.barrier()

    def resume(self, path):
        if os.environ.get("RANK", "0") == "0":
            print(f"resuming from {path}")
        checkpoint = torch.load(path, map_location="cpu")
        self.model.module.load_state_dict(checkpoint["model"])
