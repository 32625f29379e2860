"""DDP003 done right: early exits on some ranks skip only rank-local work."""

import torch
import torch.distributed as dist


def save_checkpoint(model, local_rank):
    dist.barrier()  # every rank, before anyone leaves
    if local_rank != 0:
        return
    torch.save(model.module.state_dict(), "ckpt.pt")


def first_process_downloads(rank):
    if rank != 0:
        dist.barrier()
        return
    print("downloading")
    dist.barrier()


def train(model, loader, optimizer, rank, max_steps):
    for step, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        dist.all_reduce(loss)
        if step >= max_steps:  # same on every rank
            break
        if rank != 0:
            continue
        print(step, loss.item())


def log_only(message, rank):
    if rank != 0:
        return
    print(message)
