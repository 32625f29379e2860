"""torch ddp_comm_hooks default_hooks: DDP with fp16_compress_hook (half-precision all-reduce); correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/blob/38dfbe6f2fb7cc6b9d0e407e5b1fd4214f058365/torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py",
    "summary": "PyTorch's default DDP communication hooks: fp16_compress_hook casts each gradient bucket to "
    "float16, all-reduces it asynchronously and decompresses it in the future's callback "
    "(ddp_model.register_comm_hook(process_group, fp16_compress_hook)). A correct program: every rank "
    "registers the same hook before training, so each bucket's half-precision all-reduce is matched.",
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 2))
    # A small bucket cap so the model's gradients travel in more than one bucket.
    ddp = DDP(model, bucket_cap_mb=0.004)
    ddp.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(31 + rank)
    for step in range(6):
        x, y = torch.randn(24, 20), torch.randint(0, 2, (24,))
        loss = nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.detach().sum().item() for p in ddp.parameters())
    print(f"[rank{rank}] last loss {loss.item():.4f} param checksum {checksum:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
