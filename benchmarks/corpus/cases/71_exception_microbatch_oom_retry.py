"""mosaicml/composer#1236: one rank's OOM inside the micro-batch loop is caught, it breaks out and retries smaller."""

EXPECT = {
    "source": "https://github.com/mosaicml/composer/pull/1236",
    "summary": "'Autograd accum fix': with automatic gradient accumulation, 'some ranks perform their "
               "micro-batching loops and block when reducing their gradients while another rank has OOM'd' - "
               "the OOM is caught, and that rank leaves its micro-batch loop to retry the batch with a smaller "
               "micro-batch size (distilled to plain DDP with no_sync accumulation: rank 1's batch holds one "
               "very long sequence, so its padded attention runs out of memory in the first micro-batch).",
    "family": "exception",
    "world_size": 2,
    "kind": "caught_exception",
    "ranks": [1],
    "line": "microbatch_oom_except",
    "fix": ["all_reduce", "skip together", "every rank"],
}

import contextlib
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

ATTENTION_LIMIT = 64 * 1024  # the largest attention score tensor that fits in device memory, in elements


def mark():
    # Printed before every collective-bearing micro-step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        b, length, _ = x.shape
        if b * length * length > ATTENTION_LIMIT:
            raise RuntimeError("CUDA out of memory. Tried to allocate 6.00 GiB (GPU 1; 39.39 GiB total capacity)")
        h = self.norm(self.proj(x).reshape(b * length, 16)).reshape(b, length, 16)
        h = (h @ h.transpose(1, 2) / 4.0).softmax(-1) @ h
        return self.head(h.mean(1))


def batch(rank, step, generator):
    length = 96 if (rank == 1 and step == 2) else 16  # padded to the longest sequence in the batch
    x = torch.randn(32, length, 8, generator=generator)
    return x, x.mean((1, 2)).unsqueeze(1)


def train_batch(model, optimizer, x, y, microbatch_size):
    while True:
        optimizer.zero_grad()
        chunks = list(zip(x.split(microbatch_size), y.split(microbatch_size)))
        oom = False
        for index, (xs, ys) in enumerate(chunks):
            last = index == len(chunks) - 1
            try:
                with contextlib.nullcontext() if last else model.no_sync():
                    mark()
                    loss = nn.functional.mse_loss(model(xs), ys) / len(chunks)
                    loss.backward()
            except RuntimeError as error:  # LINE:microbatch_oom_except
                if "out of memory" not in str(error):
                    raise
                oom = True
                break
        if not oom:
            optimizer.step()
            return microbatch_size
        microbatch_size //= 2
        print(f"OOM: retrying the batch with micro-batches of {microbatch_size}", file=sys.stderr, flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(Encoder())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    microbatch_size = 16
    for step in range(6):
        x, y = batch(rank, step, generator)
        microbatch_size = train_batch(model, optimizer, x, y, microbatch_size)
    mark()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
