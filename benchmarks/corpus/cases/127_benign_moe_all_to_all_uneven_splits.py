"""torchtitan ExpertParallel token dispatch: all_to_all the expert counts, then uneven all_to_all of tokens; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/torchtitan/blob/31f33c14d61beabed4d4eb650a518357b29d6e35/torchtitan/distributed/expert_parallel.py",  # noqa: E501
    "summary": "ExpertParallel._token_dispatch first exchanges num_tokens_per_expert with an even all_to_all_single, "
    "derives input_splits / output_splits from it, then moves the routed tokens with "
    "all_to_all_single_autograd(routed_input, output_splits, input_splits); _token_combine sends them "
    "back with the splits swapped. Split sizes differ per rank and per step but always agree between "
    "sender and receiver, so every exchange matches.",
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
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd

NUM_EXPERTS = 4
DIM = 8


def main():
    dist.init_process_group("gloo")
    rank, ep = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    local_experts = NUM_EXPERTS // ep
    torch.manual_seed(0)
    router = nn.Linear(DIM, NUM_EXPERTS)  # replicated router
    torch.manual_seed(10 + rank)
    experts = nn.Parameter(torch.randn(local_experts, DIM, DIM) * 0.1)  # this rank's experts
    optimizer = torch.optim.SGD([experts, *router.parameters()], lr=0.1)
    for step in range(4):
        tokens = torch.randn(9 + 5 * rank + step, DIM)  # uneven token counts per rank
        scores = router(tokens).softmax(-1)
        top_score, expert_idx = scores.max(-1)
        order = expert_idx.argsort(stable=True)
        routed = tokens[order] * top_score[order, None]
        num_tokens_per_expert = torch.bincount(expert_idx, minlength=NUM_EXPERTS)
        with torch.no_grad():
            counts_from_peers = all_to_all_single(num_tokens_per_expert, None, None, group=group)
            counts_from_peers = torch.ops._c10d_functional.wait_tensor(counts_from_peers)
            input_splits = num_tokens_per_expert.view(ep, -1).sum(1).tolist()
            output_splits = counts_from_peers.view(ep, -1).sum(1).tolist()
        received = all_to_all_single_autograd(routed, output_splits, input_splits, group)
        # received is laid out [from rank 0: e0 tokens, e1 tokens][from rank 1: e0, e1]; run the local experts
        per_src = counts_from_peers.view(ep, local_experts)
        outputs, offset = [], 0
        for src in range(ep):
            for e in range(local_experts):
                n = int(per_src[src, e])
                outputs.append(torch.tanh(received[offset : offset + n] @ experts[e]))
                offset += n
        expert_out = torch.cat(outputs)
        combined = all_to_all_single_autograd(expert_out, input_splits, output_splits, group)
        out = torch.empty_like(combined)
        out[order] = combined
        loss = (out - tokens).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in router.parameters():  # the router is data-parallel
            dist.all_reduce(p.grad)
            p.grad /= ep
        optimizer.step()
        print(
            f"[rank{rank}] step {step} splits in {input_splits} out {output_splits} loss {loss.item():.4f}", flush=True
        )
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
