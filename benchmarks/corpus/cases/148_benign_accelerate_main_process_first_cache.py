"""HF Accelerate nlp_example: dataset preprocessing under main_process_first, then training; correct."""

EXPECT = {
    "source": "https://github.com/huggingface/accelerate/blob/main/examples/nlp_example.py",
    "summary": "The Accelerate NLP example maps the tokenizer over the dataset inside "
    "`with accelerator.main_process_first():` so the main process builds the cache while the others wait in "
    "a barrier, then the others load the cached result. Here the main process spends a second building a "
    "cache file that the other process then reads; then all train a prepared model and report with "
    "accelerator.print. Every process passes both barriers of main_process_first: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import os
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

CACHE = os.path.join(tempfile.gettempdir(), f"acc_mpf_cache_{os.environ['MASTER_PORT']}.pt")  # one per job


def preprocess():
    """Like datasets.map with a cache file: the first caller builds it, later callers load it."""
    if os.path.exists(CACHE):
        return torch.load(CACHE), "loaded cache"
    time.sleep(1.0)  # tokenizing the whole corpus
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 50, (64, 6), generator=gen)
    data = {"x": tokens.float() / 50.0, "y": (tokens.sum(dim=1) % 2).long()}
    torch.save(data, CACHE + ".tmp")
    os.replace(CACHE + ".tmp", CACHE)
    return data, "built cache"


def main():
    warnings.filterwarnings("ignore")
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    with accelerator.main_process_first():  # main builds the cache, the others wait, then load it
        data, how = preprocess()
    print(f"[rank{rank}] {how}, {data['x'].shape[0]} examples")
    set_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(data["x"], data["y"]), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        total = torch.zeros(())
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.detach()
        mean = accelerator.reduce(total / len(loader), reduction="mean")
        accelerator.print(f"epoch {epoch}: mean loss {mean.item():.4f}")  # main process only
        print(f"[rank{rank}] epoch {epoch} local loss {(total / len(loader)).item():.4f}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        os.remove(CACHE)
    accelerator.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
