"""Megatron-LM 1F1B pipeline schedule: warmup, steady 1F1B with fused batch_isend_irecv, cooldown; correct."""

EXPECT = {
    "source": "https://github.com/NVIDIA/Megatron-LM/blob/4dabc62385799f8256fb05ccf3dfd4a7218781bd/megatron/core/pipeline_parallel/schedules.py",  # noqa: E501
    "summary": "forward_backward_pipelining_without_interleaving runs min(pp_size - rank - 1, M) warmup forwards, "
    "then a steady state of one forward and one backward per microbatch using the fused "
    "send_forward_recv_backward / send_backward_recv_forward exchanges (batch_isend_irecv of P2POps), "
    "then the cooldown backwards. The stages run different numbers of warmup steps and different p2p "
    "calls, but every isend meets the matching irecv on the neighbouring stage.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import time

import torch
import torch.distributed as dist
import torch.nn as nn

MICRO, HIDDEN, NUM_MICROBATCHES = 4, 16, 4


def p2p(send_next=None, send_prev=None, recv_prev=False, recv_next=False):
    """megatron p2p_communication._communicate: one batch_isend_irecv with every op of this exchange."""
    rank = dist.get_rank()
    ops, got_prev, got_next = [], None, None
    if send_prev is not None:
        ops.append(dist.P2POp(dist.isend, send_prev.contiguous(), rank - 1))
    if recv_prev:
        got_prev = torch.empty(MICRO, HIDDEN)
        ops.append(dist.P2POp(dist.irecv, got_prev, rank - 1))
    if send_next is not None:
        ops.append(dist.P2POp(dist.isend, send_next.contiguous(), rank + 1))
    if recv_next:
        got_next = torch.empty(MICRO, HIDDEN)
        ops.append(dist.P2POp(dist.irecv, got_next, rank + 1))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return got_prev, got_next


class MicrobatchRun:
    """One iteration's microbatch bookkeeping: inputs / outputs kept until their backward."""

    def __init__(self, stage, data, targets, first, last):
        self.stage, self.data, self.targets, self.first, self.last = stage, data, targets, first, last
        self.inputs, self.outputs, self.losses, self.next_mb = [], [], [], 0

    def forward(self, inp):
        x = self.data[self.next_mb] if self.first else inp.requires_grad_()
        out = self.stage(x)
        if self.last:
            out = (out - self.targets[self.next_mb]).pow(2).mean() / NUM_MICROBATCHES
            self.losses.append(out.item())
        self.next_mb += 1
        self.inputs.append(x)
        self.outputs.append(out)
        return out

    def backward(self, out_grad):
        x, out = self.inputs.pop(0), self.outputs.pop(0)
        torch.autograd.backward(out, grad_tensors=None if self.last else out_grad)
        return None if self.first else x.grad


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    torch.manual_seed(rank)
    stage = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.1)
    torch.manual_seed(100)
    data = [torch.randn(MICRO, HIDDEN) for _ in range(NUM_MICROBATCHES)]
    targets = [torch.randn(MICRO, HIDDEN) for _ in range(NUM_MICROBATCHES)]
    for it in range(3):
        optimizer.zero_grad()
        run = MicrobatchRun(stage, data, targets, first, last)
        forward, backward = run.forward, run.backward
        num_warmup = min(world - rank - 1, NUM_MICROBATCHES)
        num_remaining = NUM_MICROBATCHES - num_warmup
        for _ in range(num_warmup):  # warmup forwards
            inp, _ = p2p(recv_prev=not first)
            out = forward(inp)
            p2p(send_next=None if last else out.detach())
        inp = p2p(recv_prev=not first)[0] if num_remaining > 0 else None
        for i in range(num_remaining):  # steady state: 1F1B
            out = forward(inp)
            _, out_grad = p2p(send_next=None if last else out.detach(), recv_next=not last)  # send fwd, recv bwd
            in_grad = backward(out_grad)
            if i == num_remaining - 1:
                p2p(send_prev=in_grad)
            else:
                inp, _ = p2p(send_prev=in_grad, recv_prev=not first)  # send bwd, recv fwd
        for _ in range(num_warmup):  # cooldown backwards
            _, out_grad = p2p(recv_next=not last)
            p2p(send_prev=backward(out_grad))
        optimizer.step()
        if last:
            print(f"[rank{rank}] iter {it} loss {sum(run.losses):.4f}", flush=True)
    checksum = sum(p.detach().sum().item() for p in stage.parameters())
    print(f"[rank{rank}] stage params checksum {checksum:.4f}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
