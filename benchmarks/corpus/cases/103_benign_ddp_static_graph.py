"""pytorch/pytorch#71459: DDP(static_graph=True) with reentrant checkpointing and a never-used head; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/pull/71459",
    "summary": "'[PT1.11] make static graph to be stable' adds static_graph to the DDP constructor: DDP learns "
    "the graph (which parameters are used, in which order) in the first iteration and then supports "
    "cases plain DDP cannot, such as reentrant activation checkpointing on a model with unused parameters. "
    "A correct program: the same graph on every rank and every step (one head is never used), so the "
    "bucketed all-reduces match from the second iteration on.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.checkpoint as checkpoint
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 12))
        self.head = nn.Linear(12, 1)
        self.aux_head = nn.Linear(12, 3)  # defined but never used in forward: a static unused set

    def forward(self, x):
        h = checkpoint.checkpoint(self.block, x, use_reentrant=True)
        return self.head(h + x)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(Net(), static_graph=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    torch.manual_seed(7 + rank)
    for step in range(6):
        x = torch.randn(16, 12, requires_grad=True)  # reentrant checkpoint needs an input that requires grad
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.detach().sum().item() for p in ddp.module.head.parameters())
    print(f"[rank{rank}] last loss {loss.item():.5f} head checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
