"""yyliu01/PS-MT#3: a rank with no confident pseudo-label `continue`s past the backward the other waits in."""

EXPECT = {
    "source": "https://github.com/yyliu01/PS-MT/issues/3",
    "summary": "'Training with multi-GPUs': the warm-up works but _train_epoch gets stuck on several GPUs; the "
               "author: 'In case there isn't any confident pseudo-mask for 1 GPU, and another GPU will "
               "infinitely hangs in the backward process' (distilled: a mean-teacher step that skips the "
               "unsupervised backward with `continue` when the teacher is confident about no sample of the "
               "rank's unlabelled batch).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [1],
    "line": "no_confident_continue",
    "fix": ["all_reduce", "zero", "every rank"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

THRESHOLD = 0.9


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def unlabelled_batches(rank):
    generator = torch.Generator().manual_seed(rank)
    for index in range(8):
        x = 4.0 * torch.randn(16, 8, generator=generator)
        if rank == 1 and index == 3:
            x = 0.01 * torch.randn(16, 8, generator=generator)  # washed-out frames: the teacher is unsure of all
        yield x


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    student = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                                    nn.Linear(16, 3)))
    teacher = nn.Linear(8, 3)  # the EMA teacher, rank-local and frozen here
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01)
    for step, x in enumerate(unlabelled_batches(rank)):
        with torch.no_grad():
            probs = teacher(x).softmax(1)
        confidence, pseudo = probs.max(1)
        mask = confidence >= THRESHOLD
        mark()
        logits = student(x)
        if not mask.any():
            print(f"[rank{rank}] step {step}: no confident pseudo-label, skipping", file=sys.stderr, flush=True)
            continue  # LINE:no_confident_continue
        loss = nn.functional.cross_entropy(logits[mask], pseudo[mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
