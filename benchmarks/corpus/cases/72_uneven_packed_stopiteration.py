"""PrimeIntellect-ai/prime-rl#2246: packing gives rank 0 one batch more; rank 1 hits StopIteration first."""

EXPECT = {
    "source": "https://github.com/PrimeIntellect-ai/prime-rl/pull/2246",
    "summary": "'feat: add num_epochs config to SFT trainer' (review): StopIteration from dataset exhaustion is "
               "not synchronized across ranks; samples are distributed round-robin and packing produces "
               "different numbers of packed sequences per rank (the ±1 acknowledged in the PR), so the rank "
               "that hits StopIteration breaks out of the training loop while the others hang in the gradient "
               "all-reduce (distilled: a `while True: next(it)` loop over packed sequences, plain DDP).",
    "family": "collective",
    "world_size": 2,
    "kind": "uneven_inputs",
    "ranks": [0],
    "line": "packed_backward",
    "fix": ["join", "drop_last", "distributedsampler", "same number"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

SEQ_LEN = 64
VOCAB = 32


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def sft_samples():
    generator = torch.Generator().manual_seed(7)
    lengths = [20, 45, 70, 12, 33, 90, 51, 8, 30, 27, 40, 15, 12, 23, 5, 11]
    return [torch.randint(0, VOCAB, (n,), generator=generator) for n in lengths]


def packed_sequences(rank, world_size):
    # Round-robin assignment, then concatenate and cut into SEQ_LEN chunks, dropping the trailing partial one.
    tokens = torch.cat(sft_samples()[rank::world_size])
    for start in range(0, tokens.numel() - SEQ_LEN + 1, SEQ_LEN):
        yield tokens[start:start + SEQ_LEN]


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data_iter = iter(packed_sequences(rank, world_size))
    step, dataset_exhausted = 0, False
    while True:
        try:
            sequence = next(data_iter)
        except StopIteration:
            dataset_exhausted = True
            break
        mark()
        logits = model(sequence[:-1])
        loss = nn.functional.cross_entropy(logits, sequence[1:])
        optimizer.zero_grad()
        loss.backward()  # LINE:packed_backward
        optimizer.step()
        step += 1
    print(f"[rank{rank}] dataset exhausted={dataset_exhausted} after {step} packed sequences", file=sys.stderr,
          flush=True)
    mark()
    dist.barrier()  # then the end-of-epoch metrics
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
