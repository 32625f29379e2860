"""pytorch/pytorch#172668: each pipeline rank waits for its isend() to finish before it posts the matching irecv()."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/172668",
    "summary": "'Pipeline communication blocks the execution of pipeline stages': with Interleaved1F1B on pp=2 "
               "rank 0 is stuck at [0SEND_F1, 2RECV_F0] and rank 1 at [1SEND_F0, 1RECV_F1]; both wait for "
               "their send to finish before they receive, so neither send can ever finish.",
    "family": "p2p",
    "world_size": 2,
    "kind": "p2p_deadlock",
    "ranks": [0, 1],
    "line": "isend_wait",
    "fix": ["irecv", "batch_isend_irecv", "parity"],
}

import sys
import time

import torch
import torch.distributed as dist

# Rank 0 holds stages 0 and 2, rank 1 stages 1 and 3 (interleaved, pp=2). The step each rank is on when it hangs:
# rank 0 sends stage 0's microbatch 1 then receives stage 2's input; rank 1 sends stage 1's microbatch 0 then
# receives stage 1's microbatch 1. Every send is waited on before the next action starts.
ACTIONS = {
    0: [("SEND", "0SEND_F1"), ("RECV", "2RECV_F0")],
    1: [("SEND", "1SEND_F0"), ("RECV", "1RECV_F1")],
}


def mark():
    # Printed before each wait: the last one printed is the wait this rank never leaves.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def run_action(kind, name, peer):
    if kind == "SEND":
        work = dist.isend(torch.randn(16, 32), dst=peer)
        mark()
        work.wait()  # LINE:isend_wait
    else:
        buffer = torch.empty(16, 32)
        work = dist.irecv(buffer, src=peer)
        mark()
        work.wait()
    print(f"{name} done", file=sys.stderr, flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Warm-up microbatch 0 of stage 0 -> 1 goes through: the ranks are paired until the criss-cross.
    if rank == 0:
        dist.send(torch.randn(16, 32), dst=1)
    else:
        dist.recv(torch.empty(16, 32), src=0)
    for kind, name in ACTIONS[rank]:
        run_action(kind, name, peer=1 - rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
