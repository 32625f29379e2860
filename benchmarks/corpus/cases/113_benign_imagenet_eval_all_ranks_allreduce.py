"""pytorch/examples imagenet main.py: every rank validates its shard through DDP, then all-reduces; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/examples/blob/493da9304e56ff5160f78d01a54992db35df2a98/imagenet/main.py",
    "summary": "The ImageNet example's distributed validate(): the val set is split by a DistributedSampler "
    "(shuffle=False, drop_last=True), every rank runs model.eval() and the DDP model's forward under "
    "no_grad on its shard, the AverageMeters are summed with dist.all_reduce, and the few samples the "
    "sampler dropped are then evaluated by every rank on an auxiliary loader. A correct program: all ranks "
    "run the same number of eval forwards (BatchNorm model, buffers broadcast by DDP) and the same "
    "all-reduce, each epoch.",
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
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class AverageMeter:
    def __init__(self):
        self.sum, self.count, self.avg = 0.0, 0, 0.0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def all_reduce(self):
        total = torch.tensor([self.sum, self.count], dtype=torch.float32)
        dist.all_reduce(total, dist.ReduceOp.SUM, async_op=False)
        self.sum, self.count = total.tolist()
        self.avg = self.sum / self.count


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return TensorDataset(x, y)


def validate(val_loader, model, world_size):
    top1 = AverageMeter()

    def run_validate(loader):
        with torch.no_grad():
            for images, target in loader:
                output = model(images)
                acc = (output.argmax(1) == target).float().mean().item() * 100.0
                top1.update(acc, images.size(0))

    model.eval()
    run_validate(val_loader)
    top1.all_reduce()
    covered = len(val_loader.sampler) * world_size
    if covered < len(val_loader.dataset):
        # The samples the drop_last sampler left out: every rank evaluates them, after the all-reduce.
        aux = Subset(val_loader.dataset, range(covered, len(val_loader.dataset)))
        run_validate(DataLoader(aux, batch_size=4, shuffle=False))
    return top1.avg


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    train_set, val_set = make_data(64, seed=1), make_data(27, seed=2)  # 27: not divisible by 2 ranks
    train_sampler = DistributedSampler(train_set)
    val_sampler = DistributedSampler(val_set, shuffle=False, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=8, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=4, sampler=val_sampler)
    for epoch in range(3):
        train_sampler.set_epoch(epoch)
        model.train()
        for images, target in train_loader:
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        acc1 = validate(val_loader, model, world_size)
        print(f"[rank{rank}] epoch {epoch} val acc@1 {acc1:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
