"""pytorch/pytorch#113376: send(size 3) -> recv(size 5) hangs under NCCL; gloo completes it and reports nothing."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/113376",
    "summary": "'Weird and buggy batch_isend_irecv behavior': send of 3 elements into a recv of 4 returns with "
               "incomplete data, into a recv of 5 it hangs (NCCL).",
    "family": "p2p",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
    "gloo_note": "On gloo a receive larger than the message completes as soon as the smaller message arrives "
                 "(the rest of the buffer stays as it was), so nothing waits: silent corruption, no hang.",
}

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.arange(3.0), 1)])
    else:
        t1 = torch.zeros(5)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, t1, 0)])
    for req in reqs:
        req.wait()
    if rank == 1:
        print(f"received {t1.tolist()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
