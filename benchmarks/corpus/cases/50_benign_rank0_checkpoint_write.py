"""mosaicml/llm-foundry#733: rank 0 writes a big checkpoint for seconds while the others wait: slow, not hung."""

EXPECT = {
    "source": "https://github.com/mosaicml/llm-foundry/pull/733",
    "summary": "'Add a wait for checkpoint saving': when saving large checkpoints, timeouts may occur because "
               "rank 0 takes significantly longer to finish since it is saving; the other ranks wait. A correct "
               "program: the job finishes once the write is done.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

CHUNK_BYTES = 4 << 20
THROTTLE_S = 0.2  # per 4 MiB chunk, about 20 MB/s: a shared network filesystem under load


def write_checkpoint(model, path, chunks=20):
    # The state dict first, then the "optimizer shards": written and fsynced chunk by chunk.
    torch.save(model.state_dict(), path + ".model")
    with open(path, "wb") as handle:
        for _ in range(chunks):
            handle.write(os.urandom(CHUNK_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
            time.sleep(THROTTLE_S)
    os.remove(path)
    os.remove(path + ".model")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(16, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    start = time.time()
    if rank == 0:
        write_checkpoint(model, os.path.join(tempfile.gettempdir(), f"corpus-50-{os.getpid()}.ckpt"))
    dist.barrier()  # the other ranks wait here until rank 0 has saved
    print(f"[rank{rank}] checkpoint barrier passed after {time.time() - start:.1f} s", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
