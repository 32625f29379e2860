"""sgl-project/sgl-kernel-npu#69: a rank with zero tokens for a peer's expert skips its send; the peer waits forever."""

EXPECT = {
    "source": "https://github.com/sgl-project/sgl-kernel-npu/issues/69",
    "summary": "'Potential deadlock in dispatch & combine when some ranks receive zero tokens': ranks that have "
               "no tokens to exchange continue without waiting, ranks that do expect a message from every rank "
               "and block, so some ranks wait while others have moved ahead (distilled: an expert-parallel "
               "dispatch written with isend/recv whose send helper returns early when the rank routed no token "
               "to the peer's expert; the peer still receives a count from every rank).",
    "family": "p2p",
    "world_size": 2,
    "kind": "p2p_deadlock",
    "ranks": [1],
    "line": "zero_token_return",
    "fix": ["zero", "always send", "same number", "matching"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

HIDDEN = 8


def mark():
    # Printed before every blocking call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def send_to_expert(tokens, peer):
    if tokens.shape[0] == 0:
        return []  # LINE:zero_token_return
    count = torch.tensor([tokens.shape[0]])
    return [dist.isend(count, dst=peer), dist.isend(tokens.contiguous(), dst=peer)]


def recv_from(peer):
    count = torch.zeros(1, dtype=torch.long)
    mark()
    dist.recv(count, src=peer)
    tokens = torch.empty(int(count.item()), HIDDEN)
    dist.recv(tokens, src=peer)
    return tokens


def batch(rank, step, generator):
    x = torch.randn(16, HIDDEN, generator=generator)
    if rank == 1 and step == 2:
        x[:, 0] = x[:, 0].abs() + 0.1  # this batch routes every token to rank 1's own expert
    return x


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    torch.manual_seed(rank)
    expert = nn.Linear(HIDDEN, HIDDEN)  # rank r hosts expert r
    generator = torch.Generator().manual_seed(rank)
    for step in range(6):
        x = batch(rank, step, generator)
        route = (x[:, 0] > 0).long()  # expert 1 for positive first feature, expert 0 otherwise
        local, remote = x[route == rank], x[route == peer]
        pending = send_to_expert(remote, peer)
        incoming = recv_from(peer)
        for work in pending:
            work.wait()
        out = expert(torch.cat([local, incoming]))
        aux = out.pow(2).mean().reshape(1).detach()
        mark()
        dist.all_reduce(aux)  # load-balancing statistics, averaged over the expert-parallel group
        print(f"[rank{rank}] step {step}: {local.shape[0]} local + {incoming.shape[0]} received tokens",
              file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
