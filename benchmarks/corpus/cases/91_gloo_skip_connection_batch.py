"""pytorch/PiPPy#969: a skip connection plus batched recvs deadlock under NCCL groups; gloo progresses each op alone."""

EXPECT = {
    "source": "https://github.com/pytorch/PiPPy/issues/969",
    "summary": "'Skip connection + batch_isend_irecv can hang': stage 2 batches its recvs from stages 0 and 1, "
               "but stage 1 sends to 2 only after its compute, so the first batch_isend_irecv waits.",
    "family": "p2p",
    "world_size": 3,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
    "gloo_note": "On gloo batch_isend_irecv posts independent isend/irecv ops with no NCCL group semantics, so "
                 "rank 0's sends complete as soon as each recv is posted and the schedule finishes.",
}

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:  # stage 0 sends its output to stage 1 and, over the skip connection, to stage 2
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(4), 1),
                                       dist.P2POp(dist.isend, torch.ones(4), 2)])
    elif rank == 1:  # stage 1 receives, computes, then sends to stage 2
        x = torch.empty(4)
        dist.recv(x, 0)
        time.sleep(0.5)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x * 2, 2)])
    else:  # stage 2 batches both receives together
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, torch.empty(4), 0),
                                       dist.P2POp(dist.irecv, torch.empty(4), 1)])
    for req in reqs:
        req.wait()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
