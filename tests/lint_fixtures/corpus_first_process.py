"""Correct "rank 0 first" idioms from Hugging Face examples and YOLOv5: complementary rank-conditional barriers."""

from contextlib import contextmanager

import torch
import torch.distributed as dist


@contextmanager
def torch_distributed_zero_first(local_rank: int):
    # the other ranks wait for the local master to do something first
    if local_rank not in [-1, 0]:
        dist.barrier(device_ids=[local_rank])
    yield
    if local_rank == 0:
        dist.barrier(device_ids=[0])


def load_pretrained(args):
    if args.local_rank not in [-1, 0]:
        torch.distributed.barrier()  # only the first process downloads model and vocab

    model = torch.hub.load("pytorch/vision", "resnet18", pretrained=True)

    if args.local_rank == 0:
        torch.distributed.barrier()  # the first process is done; release the others
    return model


def build_dataset(local_rank, path):
    with torch_distributed_zero_first(local_rank):
        return torch.load(path)
