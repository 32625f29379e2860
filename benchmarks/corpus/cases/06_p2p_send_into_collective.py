"""pytorch/pytorch#117682 (comment): rank 1 receives 4 of rank 0's 5 batched sends, then enters an all_reduce first."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/pull/117682",
    "summary": "A hang at batch_isend_irecv reported in '[c10d] Enable watchdog for coalesced work': rank 0 "
               "batch-sends 5 tensors, rank 1 batch-receives 4, does some computation and only then receives "
               "the 5th; rank 0 gets stuck (distilled: the computation includes a gradient-norm all_reduce).",
    "family": "p2p",
    "world_size": 2,
    "kind": "p2p_deadlock",
    "ranks": [0, 1],
    "line": "send_wait",
    "fix": ["irecv", "batch_isend_irecv", "pair"],
}

import sys
import time

import torch
import torch.distributed as dist


def mark():
    # Printed before each blocking call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def some_computation(tensors):
    norm = torch.stack([t.norm() for t in tensors]).pow(2).sum().reshape(1)
    mark()
    dist.all_reduce(norm)  # the global gradient norm, as a clipping step would compute it
    return norm.sqrt()


def rank0(tensors):
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1) for t in tensors])
    for req in reqs:
        mark()
        req.wait()  # LINE:send_wait
    some_computation(tensors)


def rank1(tensors):
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, 0) for t in tensors[:4]])
    for req in reqs:
        req.wait()
    some_computation(tensors[:4])
    dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensors[4], 0)])[0].wait()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensors = [torch.full((64,), float(i)) if rank == 0 else torch.empty(64) for i in range(5)]
    (rank0 if rank == 0 else rank1)(tensors)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
