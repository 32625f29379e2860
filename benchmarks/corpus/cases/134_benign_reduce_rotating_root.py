"""torch distributed_test reduce helper: dist.reduce to a root that rotates over the ranks; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/blob/a069159c00b60fc660b36e63b9863cb6b30cda16/torch/testing/_internal/distributed/distributed_test.py",  # noqa: E501
    "summary": "_test_reduce_helper loops `for src in group`, fills a tensor (the root with master_value, the "
    "others with worker_value), calls dist.reduce(tensor, src, op) on every rank and checks the result "
    "only on the root. Distilled into a parameter-server step: gradients are reduced to the rank "
    "step % world, which alone applies the update and broadcasts the new parameters; every rank walks "
    "the same root sequence.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    torch.manual_seed(rank + 1)
    for step in range(6):
        root = step % world  # the parameter server for this step
        loss = model(torch.randn(16, 8)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.reduce(p.grad, dst=root, op=dist.ReduceOp.SUM)
            if rank == root:
                p.data.add_(p.grad, alpha=-0.05 / world)
            dist.broadcast(p.data, src=root)
        peak = loss.detach().clone()
        dist.reduce(peak, dst=root, op=dist.ReduceOp.MAX)
        if rank == root:
            print(f"[rank{rank}] step {step} as root: max loss {peak.item():.4f}", flush=True)
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    print(f"[rank{rank}] params checksum {checksum:.4f}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
