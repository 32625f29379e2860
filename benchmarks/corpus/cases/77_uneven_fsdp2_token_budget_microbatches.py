"""verl-project/verl#6176: token-budgeted micro-batching gives the ranks different micro-batch counts under FSDP."""

EXPECT = {
    "source": "https://github.com/verl-project/verl/issues/6176",
    "summary": "'dynamic_bsz micro-batch count mismatch causes FSDP deadlock': prepare_dynamic_batch() can "
               "synchronise micro-batch counts across data-parallel ranks, but the actor never passes dp_group, "
               "so each GPU computes its own number of micro-batches from its token count; when one GPU finishes "
               "its micro-batch loop early, the others call the FSDP module, whose all-gather the exited GPU "
               "never joins (distilled: FSDP2 on gloo, an inner micro-batch loop inside the update loop, "
               "rank 1's mini-batch holding the longer responses in the second update).",
    "family": "collective",
    "world_size": 2,
    "kind": "uneven_inputs",
    "ranks": [1],
    "line": "micro_forward",
    "fix": ["same number", "dp_group", "all_reduce", "join", "pad"],
}

import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

MAX_TOKEN_LEN = 64
VOCAB = 32


def mark():
    # Printed before every collective-bearing call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, VOCAB)

    def forward(self, tokens):
        return self.head(self.body(self.embed(tokens)))


def mini_batch(rank, update, generator):
    # Every rank gets the same number of responses; their lengths differ from rank to rank.
    lengths = [40, 44, 36, 48] if (rank == 1 and update == 1) else [20, 30, 25, 28]
    return [torch.randint(0, VOCAB, (n,), generator=generator) for n in lengths]


def prepare_dynamic_batch(samples, max_token_len, dp_group=None):
    total = sum(s.numel() for s in samples)
    num_micro_batches = min(len(samples), math.ceil(total / max_token_len))
    if dp_group is not None:  # the synchronisation the caller never asks for
        count = torch.tensor([num_micro_batches])
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=dp_group)
        num_micro_batches = int(count.item())
    return [samples[i::num_micro_batches] for i in range(num_micro_batches)]


def update_policy(model, optimizer, samples):
    micro_batches = prepare_dynamic_batch(samples, max_token_len=MAX_TOKEN_LEN)  # dp_group not passed
    for micro_batch in micro_batches:
        packed = torch.cat(micro_batch)  # one padding-free forward per micro-batch
        mark()
        logits = model(packed[:-1])  # LINE:micro_forward
        loss = nn.functional.cross_entropy(logits, packed[1:]) * len(micro_batch) / len(samples)
        loss.backward()
    mark()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    optimizer.zero_grad()
    return len(micro_batches), grad_norm.item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Policy()
    for module in (model.embed, model.body, model.head):
        fully_shard(module)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    for update in range(4):
        count, norm = update_policy(model, optimizer, mini_batch(rank, update, generator))
        print(f"[rank{rank}] update {update}: {count} micro-batches, grad norm {norm:.3f}", file=sys.stderr,
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
