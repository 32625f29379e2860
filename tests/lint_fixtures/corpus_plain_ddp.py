"""Correct plain PyTorch DDP training with mp.spawn: rank 0 logs, evaluates through .module and saves."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def setup(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12355")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


def evaluate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(dim=1) == y).sum().item()
    model.train()
    return correct / len(loader.dataset)


def train(rank, world_size, epochs=3):
    setup(rank, world_size)
    dataset = TensorDataset(torch.randn(256, 10), torch.randint(0, 2, (256,)))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    val_loader = DataLoader(dataset, batch_size=64)

    model = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(x), y)
            loss.backward()
            optimizer.step()
        loss_tensor = loss.detach().clone()
        dist.all_reduce(loss_tensor, op=dist.ReduceOp.SUM)
        if rank == 0:
            accuracy = evaluate(ddp_model.module, val_loader)
            print(f"epoch {epoch} loss {loss_tensor.item() / world_size:.4f} acc {accuracy:.3f}")
            torch.save(ddp_model.module.state_dict(), "checkpoint.pt")
        dist.barrier()

    cleanup()


if __name__ == "__main__":
    n_procs = 2
    mp.spawn(train, args=(n_procs,), nprocs=n_procs, join=True)
