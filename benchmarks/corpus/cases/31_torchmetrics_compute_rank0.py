"""Lightning-AI/torchmetrics#938: a MetricCollection is computed in a test run on rank 0 only; compute() all-gathers."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/torchmetrics/issues/938",
    "summary": "'Using Module Metrics with PyTorch DDP (without PyTorch Lightning)': training is DDP, the test "
               "function runs only on rank 0, and metrics.compute() tries to all_gather across all GPUs, so it "
               "hangs until the timeout.",
    "family": "collective",
    "world_size": 2,
    "kind": "collective_on_subset",
    "ranks": [0],
    "line": "metrics_compute",
    "fix": ["every rank", "all ranks", "sync_on_compute", "dist_sync"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchmetrics
from torch.nn.parallel import DistributedDataParallel


def mark():
    # Printed before every collective-bearing call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def test(model, metrics):
    with torch.no_grad():
        for _ in range(3):
            x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
            metrics.update(model.module(x).softmax(-1), y)
    mark()
    return metrics.compute()  # LINE:metrics_compute


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = torchmetrics.MetricCollection({
        "acc": torchmetrics.Accuracy(task="multiclass", num_classes=3),
        "f1": torchmetrics.F1Score(task="multiclass", num_classes=3),
    })
    for epoch in range(2):
        for _ in range(4):
            mark()
            loss = nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 3, (16,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:  # evaluation on a single process, as in the report
            print(f"epoch {epoch} test metrics: {test(model, metrics)}", file=sys.stderr, flush=True)
            metrics.reset()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
