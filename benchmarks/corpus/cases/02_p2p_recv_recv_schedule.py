"""pytorch/pytorch#127332: the ranks' own 1F1B step lists criss-cross, and both ranks block in recv()."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/pull/127332",
    "summary": "'[pipelining] rewrite interleaved 1f1b': communication is criss-crossed across ranks, leading to "
               "hangs, because each rank operates on its own step schedule without knowing the other ranks' "
               "sends and recvs (distilled: two stages, blocking send/recv, the recv of microbatch 1 placed "
               "before the send of gradient 0).",
    "family": "p2p",
    "world_size": 2,
    "kind": "p2p_deadlock",
    "ranks": [0, 1],
    "line": "schedule_recv",
    "fix": ["irecv", "batch_isend_irecv", "order"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

# Each rank's actions, written for that rank alone: stage 0 waits for gradient 0 before it sends microbatch 1,
# stage 1 waits for microbatch 1 before it sends gradient 0.
SCHEDULES = {
    0: [("F", 0), ("SEND_F", 0), ("RECV_B", 0), ("B", 0), ("F", 1), ("SEND_F", 1), ("RECV_B", 1), ("B", 1)],
    1: [("RECV_F", 0), ("F", 0), ("RECV_F", 1), ("F", 1), ("B", 0), ("SEND_B", 0), ("B", 1), ("SEND_B", 1)],
}


def mark():
    # Printed just before every receive: the last one printed is the receive this rank never leaves.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class Stage:
    def __init__(self, rank):
        torch.manual_seed(rank)
        self.rank, self.peer = rank, 1 - rank
        self.layer = nn.Linear(8, 8)
        self.inputs, self.outputs, self.grads = {}, {}, {}

    def run(self, action, mb):
        if action == "F":
            x = self.inputs.get(mb, torch.randn(4, 8)).requires_grad_()
            self.inputs[mb], self.outputs[mb] = x, self.layer(x)
        elif action == "B":
            grad = self.grads.get(mb, torch.ones(4, 8))
            self.outputs[mb].backward(grad)
        elif action in ("SEND_F", "SEND_B"):
            payload = self.outputs[mb] if action == "SEND_F" else self.inputs[mb].grad
            dist.send(payload.detach(), dst=self.peer)
        else:
            buffer = torch.empty(4, 8)
            mark()
            dist.recv(buffer, src=self.peer)  # LINE:schedule_recv
            (self.inputs if action == "RECV_F" else self.grads)[mb] = buffer


def main():
    dist.init_process_group("gloo")
    stage = Stage(dist.get_rank())
    for action, mb in SCHEDULES[stage.rank]:
        stage.run(action, mb)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
