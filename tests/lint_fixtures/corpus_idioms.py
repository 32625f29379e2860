"""Correct idioms that mention ranks next to collectives: none of them hangs."""

import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@contextmanager
def main_rank_goes_first():
    # rank 0 runs the body first; the others wait at the barrier, then run it
    if dist.get_rank() == 0:
        yield
        dist.barrier()
    else:
        dist.barrier()
        yield


def maybe_distributed_barrier(local_rank):
    if local_rank != -1:  # "are we distributed?", the same answer on every rank
        dist.barrier()


def unwrap(model):
    return model.module if hasattr(model, "module") else model


def log_predictions(model, batch, rank):
    model = DDP(model)
    plain = model.module if isinstance(model, DDP) else model
    if rank == 0:
        with torch.no_grad():
            print(plain(batch).argmax(dim=-1))
            print(unwrap(model)(batch).shape)


def gather_scores(score, rank, world_size):
    scores = [None] * world_size
    dist.all_gather_object(scores, score)
    if rank == 0:
        best = max(scores)
        print(f"best score {best}")
    for peer in range(world_size):  # the same trip count on every rank
        if peer == rank:
            print(f"rank {rank} reporting")
        dist.barrier()


def exchange_with_neighbour(tensor, rank, world_size):
    if rank % 2 == 0:
        dist.send(tensor, dst=(rank + 1) % world_size)
        dist.recv(tensor, src=(rank + 1) % world_size)
    else:
        dist.recv(tensor, src=rank - 1)
        dist.send(tensor, dst=rank - 1)


def per_node_cache(path):
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if local_rank == 0 and not os.path.exists(path):
        torch.save(torch.zeros(10), path)
    dist.barrier()
    return torch.load(path)
