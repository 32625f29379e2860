"""torch DDP docs, find_unused_parameters=True: a branch skipped on odd steps (on all ranks alike); correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/blob/25562d3d418774598bd22d0fae875897a96a917b/torch/nn/parallel/distributed.py",
    "summary": "DistributedDataParallel's find_unused_parameters: DDP traverses the autograd graph from the "
    "forward's outputs and marks the parameters that got no gradient as ready, so the bucket all-reduces "
    "still complete when part of the model is skipped in a step. A correct program: the refinement branch "
    "runs only on even steps, decided by the step number, the same on both ranks.",
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
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(10, 20), nn.ReLU())
        self.refine = nn.Sequential(nn.Linear(20, 20), nn.ReLU())  # used on some steps only
        self.head = nn.Linear(20, 1)

    def forward(self, x, use_refine):
        h = self.encoder(x)
        if use_refine:
            h = h + self.refine(h)
        return self.head(h)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(Net(), find_unused_parameters=True)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    torch.manual_seed(11 + rank)
    for step in range(8):
        use_refine = step % 2 == 0  # a schedule every rank shares (e.g. a curriculum), not a per-rank choice
        x, y = torch.randn(16, 10), torch.randn(16, 1)
        loss = nn.functional.mse_loss(ddp(x, use_refine), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.detach().sum().item() for p in ddp.parameters())
    print(f"[rank{rank}] last loss {loss.item():.5f} param checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
