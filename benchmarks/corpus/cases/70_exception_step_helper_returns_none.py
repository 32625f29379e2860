"""ashleve/lightning-hydra-template#652: a step helper catches OOM and returns None; that rank skips its backward."""

EXPECT = {
    "source": "https://github.com/ashleve/lightning-hydra-template/issues/652",
    "summary": "'How to skip the batch when OOM happens?': batches of very different sizes sometimes run out of "
               "memory; the reporter wraps the training step in try/except and returns None on OOM, which works "
               "on one GPU, but 'when I run the code on multiple GPUs, it stops when return None' (distilled to "
               "plain DDP: the step helper's pairwise loss runs out of memory on rank 1's one oversized batch, "
               "after the DDP forward; the helper catches it and returns None, and the loop skips backward).",
    "family": "exception",
    "world_size": 2,
    "kind": "caught_exception",
    "ranks": [1],
    "line": "step_oom_except",
    "fix": ["all_reduce", "skip together", "zero the loss"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

DEVICE_LIMIT = 256 * 256  # the largest similarity matrix that fits in device memory, in elements


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def pairwise_loss(embeddings, labels):
    if embeddings.shape[0] ** 2 > DEVICE_LIMIT:
        raise RuntimeError("CUDA out of memory. Tried to allocate 4.00 GiB (GPU 1; 23.69 GiB total capacity)")
    similarity = embeddings @ embeddings.T
    same = (labels[:, None] == labels[None, :]).float()
    return nn.functional.binary_cross_entropy_with_logits(similarity, same)


def training_step(model, batch):
    x, y = batch
    try:
        return pairwise_loss(model(x), y)
    except RuntimeError as error:  # LINE:step_oom_except
        if "out of memory" not in str(error):
            raise
        print(f"OOM on a batch of {x.shape[0]}, skipping it", file=sys.stderr, flush=True)
        return None


def batches(rank):
    generator = torch.Generator().manual_seed(rank)
    for index in range(6):
        rows = 512 if (rank == 1 and index == 2) else 64  # a length-bucketed sampler: one huge bucket on rank 1
        yield torch.randn(rows, 8, generator=generator), torch.randint(0, 4, (rows,), generator=generator)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in batches(rank):
        mark()
        loss = training_step(model, batch)
        if loss is None:
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
