"""torch.compile FAQ: torch.compile of a DDP model (DDPOptimizer splits at buckets), one rank late; correct."""

EXPECT = {
    "source": "https://docs.pytorch.org/docs/stable/torch.compiler_faq.html",
    "summary": "The torch.compile FAQ: compiling a DistributedDataParallel model is supported; DDPOptimizer breaks "
    "the graph at DDP bucket boundaries so the gradient all-reduces still overlap with the compiled backward. "
    "Here 1 MB buckets split the 2.6 MB model into several subgraphs, and rank 1 reaches its first "
    "(compiling) step about two seconds late (loading a cold compile cache), so rank 0 waits in the first "
    "bucket's all-reduce; after that both ranks run the same compiled steps: correct.",
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
import torch._dynamo
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    width = 256  # each hidden Linear is 256 KB of weights
    hidden = [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(10)]
    model = nn.Sequential(nn.Linear(16, width), nn.GELU(), *hidden, nn.Linear(width, 1))
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)  # 1 MB buckets (DDPOptimizer's minimum): graph splits
    if rank == 1:
        time.sleep(2.0)  # this node starts compiling late (cold cache, slower host)
    compiled = torch.compile(ddp, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    start = time.time()
    for step in range(4):
        x = torch.randn(8, 16, generator=gen)
        loss = (compiled(x) - x.mean(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # rank 0 waits in the first all-reduce of step 0
        optimizer.step()
        print(f"[rank{rank}] step {step} loss {loss.item():.4f}")
    print(f"[rank{rank}] 4 steps in {time.time() - start:.1f} s", file=sys.stderr, flush=True)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"[rank{rank}] param checksum {checksum:.5f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
