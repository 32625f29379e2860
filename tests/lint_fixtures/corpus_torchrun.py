"""Correct torchrun script: rank from the environment, rank 0 prints, logs and saves."""

import logging
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)


def reduce_mean(tensor, world_size):
    reduced = tensor.clone()
    dist.all_reduce(reduced)
    return reduced / world_size


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = dist.get_world_size()
    torch.cuda.set_device(local_rank)
    master = rank == 0

    model = torch.nn.Linear(128, 10).cuda(local_rank)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    dataset = torch.utils.data.TensorDataset(torch.randn(1024, 128), torch.randint(0, 10, (1024,)))
    loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset))
    optimizer = torch.optim.AdamW(model.parameters())

    if rank == 0:
        print(f"training on {world_size} processes")
        os.makedirs("runs", exist_ok=True)

    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(local_rank), y.cuda(local_rank)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mean_loss = reduce_mean(loss.detach(), world_size)
        if master and step % 10 == 0:
            log.info("step %d loss %.4f", step, mean_loss.item())

    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "runs/final.pt")
    dist.barrier()
    map_location = {"cuda:0": f"cuda:{local_rank}"}
    model.module.load_state_dict(torch.load("runs/final.pt", map_location=map_location)["model"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
