"""torch model_averaging averagers: post-local SGD hook plus PeriodicModelAverager every 2 steps; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/blob/e31f372af0e5c95eb8b7504f89c1290cc2817de1/torch/distributed/algorithms/model_averaging/averagers.py",
    "summary": "The PeriodicModelAverager example: DDP registers post_localSGD_hook with a PostLocalSGDState; "
    "for the first start_localSGD_iter steps gradients are all-reduced globally, afterwards only within "
    "each rank's subgroup, and after optimizer.step() averager.average_parameters() all-reduces the "
    "parameters globally every `period` steps once past warmup_steps. A correct program: both ranks share "
    "the step counter, so the periodic parameter all-reduces line up.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.algorithms.model_averaging.averagers as averagers
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 1)))
    # The default subgroup is one per node, sized by the GPU count; on CPU build it explicitly: one rank per
    # "node" here (every rank takes part in creating every subgroup).
    subgroup, _ = dist.new_subgroups(group_size=1, timeout=timedelta(seconds=60))
    warmup = 4
    state = PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=warmup)
    model.register_comm_hook(state, post_localSGD_hook)
    averager = averagers.PeriodicModelAverager(period=2, warmup_steps=warmup)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(41 + rank)
    for step in range(9):  # ends on an averaging step, so the replicas end equal
        x, y = torch.randn(16, 12), torch.randn(16, 1)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # After the warm-up, replicas drift between averagings; every 2nd step they are averaged globally.
        averager.average_parameters(model.parameters())
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    print(f"[rank{rank}] last loss {loss.item():.5f} param checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
