"""DDP001 done right: rank-local work goes through `.module`, or every rank calls the wrapper."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def rank_local_through_module(model, x, rank):
    model = DDP(model, device_ids=[rank])
    out = model(x)  # every rank
    out.sum().backward()
    if rank == 0:
        model.eval()
        with torch.no_grad():
            preview = model.module(x)
        print(preview.shape, model.state_dict().keys())
        model.train()


def balanced_branches(model, x):
    model = DDP(model)
    if dist.get_rank() == 0:
        out = model(x, return_attention=True)
    else:
        out = model(x)
    return out


def unwrapped_after_training(model, x, rank):
    model = DDP(model)
    model(x).sum().backward()
    model = model.module
    if rank == 0:
        model(x)


def uniform_check(model, x, local_rank):
    if local_rank != -1:
        model = DDP(model, device_ids=[local_rank])
    if local_rank == -1 or dist.get_world_size() > 1:
        pass
    return model(x)


def evaluate(net, loader):
    with torch.no_grad():
        return [net(batch) for batch in loader]


def one_call_away_with_module(model, loader, rank):
    model = DDP(model)
    if rank == 0:
        evaluate(model.module, loader)


class Trainer:
    def __init__(self, model):
        self.model = DDP(model)

    def validate(self, loader):
        return [self.model.module(batch) for batch in loader]

    def fit(self, loader, val_loader):
        for batch in loader:
            self.model(batch).sum().backward()
        if dist.get_rank() == 0:
            self.validate(val_loader)
        dist.barrier()


def unwrap_when_wrapped(model, x, rank):
    model = DDP(model)
    net = model.module if hasattr(model, "module") else model
    if rank == 0:
        net(x)
        model.module(x) if isinstance(model, DDP) else model(x)
        if not hasattr(model, "module"):
            model(x)
