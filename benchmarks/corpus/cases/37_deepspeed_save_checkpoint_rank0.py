"""deepspeedai/DeepSpeed#801: save_checkpoint() called on rank 0 only hangs; it synchronises all ranks inside."""

EXPECT = {
    "source": "https://github.com/deepspeedai/DeepSpeed/pull/801",
    "summary": "'[save_checkpoint] document the requirement to call for all ranks': the author called "
               "save_checkpoint for rank 0 only and got a hang; all processes must call it (distilled: an "
               "engine whose save_checkpoint starts with a barrier, as DeepSpeed's does).",
    "family": "collective",
    "world_size": 2,
    "kind": "collective_on_subset",
    "ranks": [0],
    "line": "save_call",
    "fix": ["every rank", "all ranks"],
}

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def mark():
    # Printed before every collective-bearing call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class Engine:
    """Stands in for DeepSpeedEngine: train_batch() all-reduces, save_checkpoint() is a collective."""

    def __init__(self, module):
        self.module = DistributedDataParallel(module)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.01)
        self.global_steps = 0

    def train_batch(self, x, y):
        loss = nn.functional.mse_loss(self.module(x), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.global_steps += 1

    def save_checkpoint(self, save_dir, tag):
        dist.barrier()  # every rank writes its own shard of the ZeRO state after this
        path = os.path.join(save_dir, tag, f"zero_pp_rank_{dist.get_rank()}_model_states.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(self.module.state_dict(), path)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    engine = Engine(nn.Linear(8, 1))
    save_dir = tempfile.mkdtemp(prefix="corpus-37-")
    for step in range(6):
        mark()
        engine.train_batch(torch.randn(4, 8), torch.randn(4, 1))
        if step == 2 and dist.get_rank() == 0:
            mark()
            engine.save_checkpoint(save_dir, tag=f"global_step{engine.global_steps}")  # LINE:save_call
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
