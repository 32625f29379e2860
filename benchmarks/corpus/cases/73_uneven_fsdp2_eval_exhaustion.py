"""PrimeIntellect-ai/prime-rl#2515: validation runs each rank's packed shard to exhaustion under FSDP2."""

EXPECT = {
    "source": "https://github.com/PrimeIntellect-ai/prime-rl/issues/2515",
    "summary": "'Validation loop deadlocks with FSDP due to unsynchronized iteration': run_eval_loop iterates a "
               "finite validation set to exhaustion; with FSDP each forward is a collective (an all-gather to "
               "unshard parameters); ranks get different batch counts because variable-length samples produce "
               "different numbers of fixed-size chunks per rank, and when one rank exits the loop first the rest "
               "deadlock on the next all-gather (distilled: FSDP2 on gloo, rank 1's shard packs into one chunk "
               "more).",
    "family": "collective",
    "world_size": 2,
    "kind": "uneven_inputs",
    "ranks": [1],
    "line": "eval_forward",
    "fix": ["join", "drop_last", "distributedsampler", "same number", "pad"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

SEQ_LEN = 32
VOCAB = 32


def mark():
    # Printed before every collective-bearing call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, VOCAB)

    def forward(self, tokens):
        return self.head(self.block(self.embed(tokens)))


def validation_chunks(rank, world_size):
    # Variable-length validation samples, split round-robin, concatenated and cut into SEQ_LEN chunks.
    generator = torch.Generator().manual_seed(11)
    lengths = [30, 41, 17, 25, 22, 12, 9, 28, 14, 10]
    samples = [torch.randint(0, VOCAB, (n,), generator=generator) for n in lengths]
    tokens = torch.cat(samples[rank::world_size])
    for start in range(0, tokens.numel() - SEQ_LEN + 1, SEQ_LEN):
        yield tokens[start:start + SEQ_LEN]


def run_eval_loop(model, rank, world_size):
    total_loss, total_tokens = torch.zeros(1), torch.zeros(1)
    with torch.no_grad():
        for chunk in validation_chunks(rank, world_size):
            mark()
            logits = model(chunk[:-1])  # LINE:eval_forward
            total_loss += nn.functional.cross_entropy(logits, chunk[1:], reduction="sum")
            total_tokens += chunk.numel() - 1
    mark()
    dist.all_reduce(total_loss)
    dist.all_reduce(total_tokens)
    return (total_loss / total_tokens).item()


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyLM()
    for module in (model.embed, model.block, model.head):
        fully_shard(module)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    for step in range(4):
        tokens = torch.randint(0, VOCAB, (SEQ_LEN,), generator=generator)
        mark()
        nn.functional.cross_entropy(model(tokens[:-1]), tokens[1:]).backward()
        optimizer.step()
        optimizer.zero_grad()
    val_loss = run_eval_loop(model, rank, world_size)
    print(f"[rank{rank}] val loss {val_loss:.3f}", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
