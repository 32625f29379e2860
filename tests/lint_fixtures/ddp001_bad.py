"""DDP001 cases: a DistributedDataParallel wrapper called by only some ranks."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def direct(model, x, rank):
    model = DDP(model, device_ids=[rank])
    if rank == 0:
        out = model(x)  # expect: DDP001
        print(out.mean())


def else_branch(model, x):
    model = DDP(model)
    if dist.get_rank() != 0:
        print("waiting")
    else:
        model.forward(x)  # expect: DDP001


def evaluate(net, loader):
    total = 0.0
    with torch.no_grad():
        for batch in loader:
            total += net(batch).sum().item()  # expect: DDP001
    return total


def one_call_away(model, loader):
    model = torch.nn.parallel.DistributedDataParallel(model)
    local_rank = int(os.environ["LOCAL_RANK"])
    if local_rank == 0:
        evaluate(model, loader)


def aliased_flag(model, x):
    ddp_model = DDP(model) if dist.is_initialized() else model
    is_main = dist.get_rank() == 0
    if is_main:
        ddp_model(x)  # expect: DDP001


class Sampler:
    def __init__(self, model, rank):
        self.rank = rank
        self.model = DDP(model).cuda()

    def sample(self, x):
        if self.rank != 0:
            return None
        return self.model(x)  # expect: DDP001
