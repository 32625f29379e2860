"""pytorch/tutorials ddp_tutorial demo_checkpoint: rank 0 saves (slowly), barrier, every rank loads; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/tutorials/blob/0168169603ee833e4f36cf089f412f7ff2828efb/intermediate_source/ddp_tutorial.rst",
    "summary": "The DDP tutorial's 'Save and Load Checkpoints' demo_checkpoint: only rank 0 torch.saves the DDP "
    "state_dict, a dist.barrier() makes sure no rank loads before the save is finished, then every rank "
    "torch.loads it with a map_location and trains a step; rank 0 deletes the file after the backward's "
    "all-reduce. A correct program: rank 1 waits at the barrier while rank 0's save takes about 1.5 s.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    ddp_model = DDP(ToyModel())

    # One file per job (the tutorial uses a fixed name in the temp dir; the port keeps parallel runs apart).
    checkpoint_path = os.path.join(tempfile.gettempdir(), f"model_{os.environ['MASTER_PORT']}.checkpoint")
    if rank == 0:
        # All processes see the same parameters, so saving on one process is sufficient.
        torch.save(ddp_model.state_dict(), checkpoint_path)
        time.sleep(1.5)  # a slow filesystem: the other rank waits at the barrier meanwhile
    # Make sure that no process loads the model before process 0 has saved it.
    dist.barrier()
    map_location = {"cpu": "cpu"}  # the tutorial maps cuda:0 to cuda:rank
    ddp_model.load_state_dict(torch.load(checkpoint_path, map_location=map_location))

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss = loss_fn(outputs, labels)
    loss.backward()
    optimizer.step()

    # No barrier needed before deleting: the all-reduce in backward already synchronized the ranks.
    if rank == 0:
        os.remove(checkpoint_path)
    checksum = sum(p.detach().sum().item() for p in ddp_model.parameters())
    print(f"[rank{rank}] loss {loss.item():.5f} param checksum {checksum:.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
