"""NVIDIA/Megatron-LM#5100: batched P2P ops in one fixed order deadlock PP>=4 under NCCL; gloo posts them all first."""

EXPECT = {
    "source": "https://github.com/NVIDIA/Megatron-LM/issues/5100",
    "summary": "'Pipeline Parallelism deadlock with variable_seq_lengths=True and batch_p2p_comm=True (PP>=4)': "
               "_communicate_shapes() and _batched_p2p_ops() use the fixed order [send_prev, recv_prev, "
               "send_next, recv_next] instead of the even/odd ordering of _p2p_ops().",
    "family": "p2p",
    "world_size": 4,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
    "gloo_note": "On gloo every op of a batch_isend_irecv list is posted before any is waited on and each "
                 "completes independently, so the fixed order cannot deadlock; the hang needs NCCL's grouped "
                 "launch on PP>=4.",
}

import torch
import torch.distributed as dist


def communicate_shapes(rank, world_size):
    prev_rank, next_rank = rank - 1, rank + 1
    shape = torch.tensor([8.0, 16.0, 32.0])
    ops = []
    if prev_rank >= 0:  # the fixed order of the bug report: send_prev, recv_prev, send_next, recv_next
        ops += [dist.P2POp(dist.isend, shape, prev_rank), dist.P2POp(dist.irecv, torch.empty(3), prev_rank)]
    if next_rank < world_size:
        ops += [dist.P2POp(dist.isend, shape, next_rank), dist.P2POp(dist.irecv, torch.empty(3), next_rank)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def main():
    dist.init_process_group("gloo")
    for _ in range(3):
        communicate_shapes(dist.get_rank(), dist.get_world_size())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
