"""torch.distributed.pipelining docs: ScheduleInterleaved1F1B with two virtual stages per rank; correct."""

EXPECT = {
    "source": "https://docs.pytorch.org/docs/main/distributed/pipelining.html",
    "summary": "The pipelining docs describe multi-stage-per-rank schedules: each rank builds several "
    "PipelineStage objects (stage_index = rank + i * world) and hands the list to "
    "ScheduleInterleaved1F1B, which interleaves forwards and backwards of the virtual stages and "
    "passes activations around the ranks in a loop. A correct program: a 4-layer MLP as 4 stages on 2 "
    "ranks; rank 0 holds stages 0 and 2, rank 1 stages 1 and 3 and the loss.",
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
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    num_stages = 2 * world
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(num_stages)]
    stage_ids = [rank + i * world for i in range(2)]
    stages = [PipelineStage(layers[s], s, num_stages, torch.device("cpu")) for s in stage_ids]
    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=4, loss_fn=nn.MSELoss())
    params = [p for s in stage_ids for p in layers[s].parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1)
    torch.manual_seed(1)
    for step in range(3):
        x, y = torch.randn(8, 16), torch.randn(8, 16)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            losses = []
            schedule.step(target=y, losses=losses)
            print(f"[rank{rank}] step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)
        optimizer.step()
    checksum = sum(p.detach().sum().item() for p in params)
    print(f"[rank{rank}] stages {stage_ids} params checksum {checksum:.4f}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
