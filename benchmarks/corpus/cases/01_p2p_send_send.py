"""pytorch/pytorch#109401 (main_v6): both ranks call a blocking send() before their recv(): each send waits forever."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/109401",
    "summary": "'Interleaved isend and irecv causes hang': in the thread's main_v6 both ranks send() to each other "
               "first and recv() second, and the job hangs.",
    "family": "p2p",
    "world_size": 2,
    "kind": "p2p_deadlock",
    "ranks": [0, 1],
    "line": "send_first",
    "fix": ["irecv", "batch_isend_irecv", "parity"],
}

import sys
import time

import torch
import torch.distributed as dist


def mark():
    # Printed just before the call where this rank blocks for good; the runner measures latency from the last one.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def exchange(rank, step):
    peer = 1 - rank
    outgoing = torch.full((4,), float(100 * rank + step))
    incoming = torch.empty(4)
    mark()
    dist.send(outgoing, dst=peer)  # LINE:send_first
    dist.recv(incoming, src=peer)
    return incoming


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(3):
        exchange(rank, step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
