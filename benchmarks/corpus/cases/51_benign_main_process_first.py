"""huggingface/accelerate#1303: main_process_first() builds a cache on rank 0 while the others wait: not hung."""

EXPECT = {
    "source": "https://github.com/huggingface/accelerate/issues/1303",
    "summary": "'main_process_first() and local_main_process_first() decorators do not work': the context "
               "manager is meant to let the main process run a time-consuming step (building a cache) while "
               "the others wait, then read the cache. A correct program once the context manager works: it "
               "finishes.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import json
import os
import sys
import tempfile
import time
import warnings

import torch
import torch.nn as nn
from accelerate import Accelerator


def build_vocabulary(n_docs=12000):
    # The time-consuming operation: tokenise a synthetic corpus and count tokens (a few seconds on one core).
    generator = torch.Generator().manual_seed(0)
    counts = {}
    for doc in range(n_docs):
        words = torch.randint(0, 5000, (60,), generator=generator).tolist()
        for word in words:
            counts[f"w{word}"] = counts.get(f"w{word}", 0) + 1
    return sorted(counts, key=counts.get, reverse=True)[:1024]


def main():
    warnings.filterwarnings("ignore")
    accelerator = Accelerator(cpu=True)
    cache = os.path.join(tempfile.gettempdir(), f"corpus-51-{os.environ['MASTER_PORT']}.json")
    start = time.time()
    with accelerator.main_process_first():
        if os.path.exists(cache):
            vocabulary = json.load(open(cache))  # the other ranks: read what the main process built
        else:
            vocabulary = build_vocabulary()
            json.dump(vocabulary, open(cache, "w"))
    print(f"[rank{accelerator.process_index}] vocabulary of {len(vocabulary)} after {time.time() - start:.1f} s",
          file=sys.stderr, flush=True)
    model = nn.EmbeddingBag(len(vocabulary), 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(3):
        loss = model(torch.randint(0, len(vocabulary), (4, 6))).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        os.remove(cache)
    accelerator.end_training()


if __name__ == "__main__":
    main()
