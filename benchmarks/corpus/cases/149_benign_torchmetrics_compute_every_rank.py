"""torchmetrics README DDP example: per-rank update, compute() on every rank (it syncs), reset per epoch; correct."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/torchmetrics/blob/master/README.md",
    "summary": "The torchmetrics README's DDP example (gloo) updates a module metric on each rank with that rank's "
    "batches and calls metric.compute() on every rank: compute all-gathers the metric states, so all ranks "
    "must call it; then metric.reset() before the next epoch. Here a DDP classifier trains two epochs with "
    "an Accuracy and a MeanMetric (loss) updated per batch; the ranks see different numbers of batches, which "
    "is fine because the sync happens once, in compute, on every rank: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import torch
import torch.distributed as dist
import torch.nn as nn
import torchmetrics
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)
    mean_loss = torchmetrics.MeanMetric()
    gen = torch.Generator().manual_seed(10 + rank)
    for epoch in range(2):
        model.train()
        for step in range(4):
            x = torch.randn(8, 10, generator=gen)
            y = x[:, :3].argmax(dim=1)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        n_eval = 3 + 2 * rank  # uneven evaluation shards: no collective per batch, so no problem
        with torch.no_grad():
            for _ in range(n_eval):
                x = torch.randn(5, 10, generator=gen)
                y = x[:, :3].argmax(dim=1)
                logits = model(x)
                accuracy.update(logits, y)
                mean_loss.update(nn.functional.cross_entropy(logits, y))
        acc = accuracy.compute()  # every rank: all-gathers the states
        avg = mean_loss.compute()
        print(f"[rank{rank}] epoch {epoch} eval batches {n_eval} accuracy {acc.item():.4f} loss {avg.item():.4f}")
        accuracy.reset()
        mean_loss.reset()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
