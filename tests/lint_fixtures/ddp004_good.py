"""DDP004 done right: every rank runs the loop the same number of times."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def over_world(tensor, rank, world_size):
    for peer in range(world_size):
        if peer == rank:
            tensor += 1
        dist.broadcast(tensor, src=peer)


def sampler_loop(dataset, model, rank, world_size):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    loader = DataLoader(dataset, sampler=sampler, batch_size=8)
    for batch in loader:
        loss = model(batch).mean()
        dist.all_reduce(loss)


def fixed_window(items, rank, per_rank):
    for item in items[rank * per_rank:(rank + 1) * per_rank]:
        dist.all_reduce(torch.tensor(item))


def fixed_count(tensor, rank):
    for _ in range(2 * rank, 2 * rank + 2):
        dist.all_reduce(tensor)


def per_rank_loop_without_collectives(shards, rank):
    total = 0
    for batch in shards[rank]:
        total += len(batch)
    tensor = torch.tensor(total)
    dist.all_reduce(tensor)
    return tensor
