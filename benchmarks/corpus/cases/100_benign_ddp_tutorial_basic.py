"""pytorch/tutorials ddp_tutorial demo_basic: every rank runs the same DDP forward/backward/step loop; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/tutorials/blob/0168169603ee833e4f36cf089f412f7ff2828efb/intermediate_source/ddp_tutorial.rst",
    "summary": "The 'Getting Started with Distributed Data Parallel' tutorial's demo_basic: wrap a ToyModel "
    "(Linear-ReLU-Linear) in DDP, then zero_grad, forward, MSELoss backward (the gradient all-reduce) and "
    "optimizer step on every rank. A correct program: both ranks run the same number of steps, so every "
    "all-reduce is matched and the replicas stay identical.",
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
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # different data per rank; DDP broadcasts rank 0's initial weights
    ddp_model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for step in range(5):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
    checksum = sum(p.detach().sum().item() for p in ddp_model.parameters())
    print(f"[rank{rank}] last loss {loss.item():.5f} param checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
