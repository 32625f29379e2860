"""DDP002 done right: every rank calls each collective the same number of times."""

import torch
import torch.distributed as dist


def save_then_sync(model, rank):
    if rank == 0:
        torch.save(model.module.state_dict(), "model.pt")
    dist.barrier()


def balanced_gather(tensor, rank, world_size):
    if rank == 0:
        gathered = [torch.zeros_like(tensor) for _ in range(world_size)]
        dist.gather(tensor, gather_list=gathered, dst=0)
        return gathered
    else:
        dist.gather(tensor, dst=0)
        return None


def point_to_point(tensor, rank):
    if rank == 0:
        dist.send(tensor, dst=1)
    elif rank == 1:
        dist.recv(tensor, src=0)


def subgroup(tensor, rank, group, group_ranks):
    if rank in group_ranks:
        dist.all_reduce(tensor, group=group)


def broadcast_config(config, rank):
    objects = [config] if rank == 0 else [None]
    dist.broadcast_object_list(objects, src=0)
    return objects[0]


def only_when_distributed(tensor):
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
    return tensor


def log_metrics(tensor):
    print(tensor.item())


def helper_without_collective(tensor, rank):
    dist.all_reduce(tensor)
    if rank == 0:
        log_metrics(tensor)
