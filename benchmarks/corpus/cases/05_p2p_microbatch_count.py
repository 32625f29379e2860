"""pytorch/torchtitan#775: the two pipeline stages disagree on the number of microbatches and both block in recv()."""

EXPECT = {
    "source": "https://github.com/pytorch/torchtitan/issues/775",
    "summary": "'PP hangs when pipeline_parallel_microbatches < pipeline_parallel_degree': a bug in the "
               "microbatch count calculation; the job hangs at the first microbatch (distilled: a GPipe schedule "
               "whose first stage derives the count from its local batch, the last stage from the config).",
    "family": "p2p",
    "world_size": 2,
    "kind": "p2p_deadlock",
    "ranks": [0, 1],
    "line": "recv_grad",
    "fix": ["microbatch"],
}

import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

CONFIG = {"n_microbatches": 4, "microbatch_size": 3, "hidden": 16}


def mark():
    # Printed before every receive: the last one printed is the receive this rank never leaves.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def first_stage(layer, batch):
    n_micro = math.ceil(len(batch) / CONFIG["microbatch_size"])  # from the local batch: 2, not the configured 4
    outputs = []
    for chunk in batch.chunk(n_micro):
        out = layer(chunk)
        dist.send(out.detach(), dst=1)
        outputs.append(out)
    for out in outputs:  # GPipe: all forwards, then all backwards
        grad = torch.empty_like(out)
        mark()
        dist.recv(grad, src=1)  # LINE:recv_grad
        out.backward(grad)


def last_stage(layer):
    n_micro, rows = CONFIG["n_microbatches"], CONFIG["microbatch_size"]
    received = []
    for _ in range(n_micro):
        act = torch.empty(rows, CONFIG["hidden"])
        mark()
        dist.recv(act, src=0)
        received.append(act.requires_grad_())
    for act in received:
        layer(act).pow(2).mean().backward()
        dist.send(act.grad, dst=0)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layer = nn.Linear(CONFIG["hidden"], CONFIG["hidden"])
    for step in range(2):
        if rank == 0:
            first_stage(layer, torch.randn(6, CONFIG["hidden"]))  # the last, short batch of the epoch: 6 rows
        else:
            last_stage(layer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
