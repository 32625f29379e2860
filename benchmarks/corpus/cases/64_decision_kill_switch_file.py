"""snowflakedb/ArcticTraining#175: a kill-switch file checked on each node's own filesystem stops node 0's rank only."""

EXPECT = {
    "source": "https://github.com/snowflakedb/ArcticTraining/pull/175",
    "summary": "'Add early exit kill switch': training sets early_stop = True when the file /tmp/at_kill_switch "
               "exists; the review: 'This isn't going to work well in multi-node situation, as you're checking "
               "one node's fs' - global rank 0 must check and signal the other nodes 'otherwise it'll break' "
               "(distilled: two single-rank nodes, each with its own /tmp; the operator touches the switch on "
               "node 0 after step 3, so rank 0 leaves the loop and rank 1 trains on).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [0],
    "line": "kill_switch_break",
    "fix": ["all_reduce", "broadcast"],
}

import os
import pathlib
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

GPUS_PER_NODE = 1


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def node_tmp(node_rank):
    # Each node has its own local /tmp; here one directory per node, unique to this run.
    path = pathlib.Path(tempfile.gettempdir()) / f"corpus-64-{os.environ['MASTER_PORT']}" / f"node{node_rank}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def operator(step):
    # Stands in for the person watching the run: logged in on node 0, they touch the kill switch after step 3.
    if step == 3:
        (node_tmp(0) / "at_kill_switch").touch()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kill_switch_path = node_tmp(rank // GPUS_PER_NODE) / "at_kill_switch"
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    early_stop = False
    for epoch in range(3):
        for step in range(20):
            x = torch.randn(16, 8, generator=generator)
            mark()
            loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            operator(epoch * 20 + step)
            if kill_switch_path.exists():
                print(f"[rank{rank}] kill switch {kill_switch_path} found: stopping", file=sys.stderr, flush=True)
                early_stop = True
            if early_stop:
                break  # LINE:kill_switch_break
        if early_stop:
            break
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
