"""NVIDIA/nccl#2130: rank 0's batch_isend_irecv list holds an irecv that rank 1's list never sends for."""

EXPECT = {
    "source": "https://github.com/NVIDIA/nccl/issues/2130",
    "summary": "'NCCL batch_isend_irecv hangs on receiver with asymmetric batched P2P ops': rank 0's second phase "
               "batches [isend(0->1), irecv(1->0)], rank 1's only [irecv(0->1)]; rank 0 waits forever.",
    "family": "p2p",
    "world_size": 2,
    "kind": "p2p_deadlock",
    "ranks": [0, 1],
    "line": "batch_wait",
    "fix": ["batch_isend_irecv", "pair", "irecv"],
}

import sys
import time

import torch
import torch.distributed as dist


def mark():
    # Printed before the waits and before the barrier: the last one is where this rank blocks.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def phase_ops(rank, phase):
    shape = (1,)
    if phase == 0 or rank == 1:  # phase 0 is symmetric; in phase 1 rank 1 only receives
        if rank == 0:
            return [dist.P2POp(dist.isend, torch.ones(shape), 1)]
        return [dist.P2POp(dist.irecv, torch.zeros(shape), 0)]
    # The asymmetric case under discussion: rank 0 also expects an answer that rank 1 never sends.
    return [dist.P2POp(dist.isend, torch.ones(shape), 1), dist.P2POp(dist.irecv, torch.zeros(shape), 1)]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for phase in range(2):
        reqs = dist.batch_isend_irecv(phase_ops(rank, phase))
        mark()
        for req in reqs:
            req.wait()  # LINE:batch_wait
        print(f"[rank{rank}] phase {phase} done", file=sys.stderr, flush=True)
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
