"""Lightning-AI/pytorch-lightning#20825: only the preempted node's rank gets SIGTERM; its stop flag ends its loop."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/pytorch-lightning/pull/20825",
    "summary": "'Fix: Synchronize SIGTERM Handling in DDP to Prevent Deadlocks': rank 0 receives SIGTERM (a "
               "Kubernetes or SLURM preemption) and leaves after the current step, the other ranks do not "
               "receive the signal, proceed into the next batch and block there waiting for rank 0 "
               "(distilled to plain DDP: a signal handler sets a stop flag that each rank checks after its step; "
               "a simulated scheduler signals the processes of node 0 only).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [0],
    "line": "sigterm_break",
    "fix": ["all_reduce", "broadcast"],
}

import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

GPUS_PER_NODE = 1
PREEMPTED_NODES = {0}
STOP = {"requested": False}


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def on_sigterm(signum, frame):
    print(f"[pid {os.getpid()}] SIGTERM: checkpointing and stopping after this step", file=sys.stderr, flush=True)
    STOP["requested"] = True


def node_agent(step, node_rank):
    # Stands in for the cluster: at step 3 the scheduler preempts node 0, whose agent sends SIGTERM to its processes.
    if step == 3 and node_rank in PREEMPTED_NODES:
        os.kill(os.getpid(), signal.SIGTERM)


def main():
    signal.signal(signal.SIGTERM, on_sigterm)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    checkpoint = os.path.join(tempfile.gettempdir(), f"corpus-63-preempt-{os.getpid()}.pt")
    for step in range(50):
        node_agent(step, rank // GPUS_PER_NODE)
        x = torch.randn(16, 8, generator=generator)
        mark()
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if STOP["requested"]:
            torch.save({"step": step, "model": model.module.state_dict()}, checkpoint)
            break  # LINE:sigterm_break
    mark()
    dist.barrier()  # every rank waits for the others before tearing the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
