"""torch_ucc barrier test: ranks take turns (random sleeps, the rank whose turn it is writes, all barrier); correct."""

EXPECT = {
    "source": "https://github.com/facebookresearch/torch_ucc/blob/bb84672ccb879ff99f799c5e6347d2a697e3c213/test/torch_barrier_test.py",  # noqa: E501
    "summary": "The torch_ucc barrier test loops over the ranks; each iteration every rank sleeps a random time, "
    "the rank whose turn it is checks in, and all ranks call barrier, so the check-ins come out in rank "
    "order. Here the turn holder appends a line to a shared log file (path agreed from MASTER_PORT) "
    "before its barrier while the others go straight to theirs; one barrier per turn on every rank.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import os
import random
import tempfile
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    log_path = os.path.join(tempfile.gettempdir(), f"turn_log_{os.environ['MASTER_PORT']}.txt")
    if rank == 0:
        open(log_path, "w").close()
    dist.barrier()
    rng = random.Random(rank)
    torch.manual_seed(rank)
    for round_ in range(3):
        value = torch.randn(4).sum().item()
        for turn in range(world):
            time.sleep(rng.randint(1, 300) / 1000)
            if rank == turn:
                with open(log_path, "a") as f:
                    f.write(f"round {round_} rank {rank} value {value:.4f}\n")
                dist.barrier()
            else:
                dist.barrier()
    dist.barrier()
    if rank == 0:
        with open(log_path) as f:
            for line in f:
                print(f"[rank{rank}] {line.strip()}", flush=True)
        os.remove(log_path)
    else:
        print(f"[rank{rank}] took 3 turns", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
