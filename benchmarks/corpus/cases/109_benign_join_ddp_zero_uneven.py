"""pytorch/tutorials generic_join: Join([ddp_model, zero_optim]) over uneven per-rank inputs; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/tutorials/blob/0e3158bae11a9a55a0b129bb6cc02de9481d9c48/advanced_source/generic_join.rst",
    "summary": "The 'Distributed Training with Uneven Inputs Using the Join Context Manager' tutorial's DDP plus "
    "ZeroRedundancyOptimizer example: both are Joinables passed to Join([model, optim]); a rank that runs "
    "out of inputs early shadows the others' gradient all-reduces (DDP's join hook) and keeps stepping and "
    "broadcasting its parameter shard (ZeRO's join hook). A correct program: rank 0 has 5 inputs and "
    "rank 1 has 9, and both leave the context with the same parameters.",
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
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer as ZeRO
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import Adam


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    optim = ZeRO(model.parameters(), Adam, lr=0.01)
    # Rank 1 gets four more inputs than rank 0.
    torch.manual_seed(61 + rank)
    inputs = [torch.randn(6, 4) for _ in range(5 + 4 * rank)]
    num_inputs = 0
    # Pass both `model` and `optim` into Join(): each joined rank runs both join hooks.
    with Join([model, optim]):
        for x in inputs:
            num_inputs += 1
            loss = model(x).pow(2).sum()
            optim.zero_grad()
            loss.backward()
            optim.step()
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    print(f"[rank{rank}] exhausted all {num_inputs} inputs, param checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
