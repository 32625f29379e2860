"""pytorch/pytorch#108971: one rank's first torch.compile runs cold and slow while the other waits: not hung."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/108971",
    "summary": "'Really slow compilation times for torch.compile causing distributed training errors': compiles "
               "take long and the jobs make no progress meanwhile, up to collective timeouts. A correct program "
               "when the compile ends before the timeout: rank 1 compiles with caches off (a cold node), rank 0 "
               "waits in the first step's all-reduce, then both train.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import sys
import time

import torch
import torch._inductor.config
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def block(width):
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        torch._inductor.config.force_disable_caches = True  # this node has no warm compile cache
    torch.manual_seed(0)
    model = nn.Sequential(*[block(32) for _ in range(6)], nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    compiled = torch.compile(ddp)  # the first step compiles forward and backward: slow on the cold rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.time()
    for step in range(4):
        loss = compiled(torch.randn(8, 32)).pow(2).mean()
        loss.backward()  # the warm rank waits here, in the gradient all-reduce, while the cold one compiles
        optimizer.step()
        optimizer.zero_grad()
    print(f"[rank{rank}] 4 steps in {time.time() - start:.1f} s", file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
