"""DDP004 cases: a collective in a loop whose trip count depends on the rank."""

import torch
import torch.distributed as dist


def warmup(tensor, rank):
    for _ in range(rank):
        dist.all_reduce(tensor)  # expect: DDP004


def strided_shards(items, rank, world_size):
    for index in range(rank, len(items), world_size):
        value = torch.tensor(items[index])
        dist.all_reduce(value)  # expect: DDP004


def my_shard(shards, rank):
    mine = shards[rank]
    for batch in mine:
        dist.barrier()  # expect: DDP004


def polling(tensor):
    step = 0
    while step < dist.get_rank() + 2:
        dist.broadcast(tensor, src=0)  # expect: DDP004
        step += 1


def sliced(files, rank, world_size):
    for path in files[rank::world_size]:
        torch.distributed.barrier()  # expect: DDP004
