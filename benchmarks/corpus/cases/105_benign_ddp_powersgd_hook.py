"""torch ddp_comm_hooks powerSGD_hook: DDP gradients compressed by PowerSGD after a warm-up; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/blob/f6b9eefb64ac16aef0e95cbbec9dfe83d3ffbeda/torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py",
    "summary": "PyTorch's PowerSGD communication hook: register_comm_hook(PowerSGDState(...), powerSGD_hook) "
    "replaces DDP's bucket all-reduce; for the first start_powerSGD_iter iterations it runs the vanilla "
    "all-reduce, then it all-reduces the low-rank factors P and Q of each matrix gradient (two all-reduces "
    "per bucket, with error feedback and warm start). A correct program: every rank registers the same "
    "state and runs the same steps, so the hook's all-reduces match.",
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
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = DDP(model)
    state = powerSGD.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=1,
        start_powerSGD_iter=3,  # vanilla all-reduce for the first iterations, then compression
        min_compression_rate=2,
        random_seed=0,
    )
    ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.02)
    torch.manual_seed(21 + rank)
    for step in range(8):
        x, y = torch.randn(32, 64), torch.randn(32, 1)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.detach().sum().item() for p in ddp.parameters())
    print(f"[rank{rank}] last loss {loss.item():.5f} param checksum {checksum:.4f} iter {state.iter}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
