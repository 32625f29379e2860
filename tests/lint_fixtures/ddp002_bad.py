"""DDP002 cases: a collective that only some ranks call."""

import torch
import torch.distributed as dist
from torch.distributed import all_reduce


def save_then_sync(model, rank):
    if rank == 0:
        torch.save(model.state_dict(), "model.pt")
        dist.barrier()  # expect: DDP002


def reduce_only_on_main(loss):
    if torch.distributed.get_rank() == 0:
        torch.distributed.all_reduce(loss)  # expect: DDP002
    return loss


def bare_import(metric, local_rank):
    if local_rank == 0:
        all_reduce(metric)  # expect: DDP002


def else_branch_only(obj):
    if dist.get_rank() == 0:
        print("main")
    else:
        dist.broadcast_object_list([obj], src=0)  # expect: DDP002


def sync_metrics(tensor):
    dist.all_reduce(tensor)  # expect: DDP002
    return tensor


def helper_one_call_away(tensor, rank):
    if rank == 0:
        sync_metrics(tensor)


def accelerate_style(accelerator, model):
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()  # expect: DDP002
        accelerator.save(model.state_dict(), "model.pt")
