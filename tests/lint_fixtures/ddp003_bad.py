"""DDP003 cases: an early exit on some ranks that skips a collective the others reach."""

import torch
import torch.distributed as dist


def save_checkpoint(model, local_rank):
    if local_rank != 0:
        return  # expect: DDP003
    torch.save(model.module.state_dict(), "ckpt.pt")
    dist.barrier()


def train(model, loader, optimizer, rank, max_steps):
    for step, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        if rank == 0 and step >= max_steps:
            break  # expect: DDP003
        dist.all_reduce(loss)


def skip_logging(loader, rank):
    for batch in loader:
        if not rank == 0:
            continue  # expect: DDP003
        stats = batch.float().mean()
        dist.broadcast(stats, src=0)
