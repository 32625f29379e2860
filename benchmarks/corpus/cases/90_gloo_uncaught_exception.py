"""pytorch/torchtitan#1790: one rank raises while the others wait in a collective; on gloo they fail at once."""

EXPECT = {
    "source": "https://github.com/pytorch/torchtitan/issues/1790",
    "summary": "'Distributed training hangs on local error instead of exit': a rank raises ValueError on a "
               "spatial-dimension mismatch and the program hangs forever (NCCL).",
    "family": "exception",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
    "gloo_note": "On gloo the raising rank's exit closes its sockets and the peer's all_reduce fails at once "
                 "with 'Connection closed by peer'; the hang needs NCCL, where the survivors wait for the "
                 "timeout (ddpwatch's dead_rank).",
}

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x, y = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8 if rank == 0 else 6)
    if x.shape[2:] != y.shape[2:]:
        print(f"RANK {rank}: SPATIAL DIM MISMATCH!", flush=True)
        raise ValueError(f"x.shape[2:] != y.shape[2:], {x.shape[2:]=}, {y.shape[2:]=}")
    dist.all_reduce(torch.cat([x, y], dim=1).sum().reshape(1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
