"""weecology/DeepForest#1426: the rank with an empty validation shard returns before the torchmetrics compute()."""

EXPECT = {
    "source": "https://github.com/weecology/DeepForest/pull/1426",
    "summary": "'fix: allow empty validation ranks in DDP metrics': _compute_epoch_metrics() skipped "
               "IntersectionOverUnion.compute() when the local rank had no ground-truth labels, so ranks with "
               "data entered TorchMetrics' distributed sync while the empty rank skipped it: a validation hang.",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [1],
    "line": "empty_return",
    "fix": ["all_reduce", "broadcast", "every rank"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchmetrics
from torch.nn.parallel import DistributedDataParallel


def mark():
    # Printed before the collectives this rank reaches: the last one printed is where it blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def validation_images(rank, world_size):
    images = [torch.rand(1, 8, 8)]  # a one-image validation set: rank 1's shard is empty
    return images[rank::world_size]


def compute_epoch_metrics(metric, targets):
    if len(targets) == 0:
        return {}  # LINE:empty_return
    mark()
    return {"iou": metric.compute().item()}  # syncs the metric state across ranks


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Conv2d(1, 1, 3, padding=1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    metric = torchmetrics.classification.BinaryJaccardIndex()
    for epoch in range(2):
        for _ in range(3):
            mark()
            model(torch.rand(2, 1, 8, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        targets = []
        for image in validation_images(rank, world_size):
            target = (image > 0.5).int()
            metric.update((model.module(image[None]).sigmoid()[0] > 0.5).float(), target)
            targets.append(target)
        results = compute_epoch_metrics(metric, targets)
        metric.reset()
        print(f"[rank{rank}] epoch {epoch}: {results}", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
