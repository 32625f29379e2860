"""torch.distributed.pipelining docs: a small MLP split into 2 PipelineStages driven by ScheduleGPipe; correct."""

EXPECT = {
    "source": "https://docs.pytorch.org/docs/main/distributed/pipelining.html",
    "summary": "The Pipeline Parallelism docs build one PipelineStage per rank from a manually split model and "
    "run schedule.step(x) on the first stage and schedule.step(target=y, losses=losses) on the last; "
    "ScheduleGPipe runs all microbatch forwards (send activations to the next stage) and then all "
    "backwards (send gradients back). The stages call step() on different lines with different "
    "arguments, but their sends and receives pair up microbatch by microbatch.",
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
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    full = build_model()
    stage_module = full[:2] if rank == 0 else full[2:]  # manual split: stage 0 / stage 1
    stage = PipelineStage(stage_module, rank, world, device)
    loss_fn = nn.MSELoss()
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.05)
    torch.manual_seed(1)
    for step in range(3):
        x, y = torch.randn(16, 16), torch.randn(16, 4)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            losses = []
            schedule.step(target=y, losses=losses)
            print(f"[rank{rank}] step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)
        optimizer.step()
    checksum = sum(p.detach().sum().item() for p in stage_module.parameters())
    print(f"[rank{rank}] stage params checksum {checksum:.4f}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
