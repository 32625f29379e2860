"""Correct nanoGPT-style script: module-level DDP setup from the environment, master_process gates I/O."""

import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
else:
    master_process = True
    device = "cuda"

model = torch.nn.Linear(64, 64).to(device)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(10)
    for k in range(10):
        x = torch.randn(8, 64, device=device)
        losses[k] = (model(x) - x).pow(2).mean().item()
    model.train()
    return losses.mean()


for iter_num in range(100):
    if iter_num % 10 == 0:
        loss_estimate = estimate_loss()  # every rank evaluates
        if master_process:
            print(f"step {iter_num}: loss {loss_estimate:.4f}")
            torch.save({"model": raw_model.state_dict(), "iter_num": iter_num}, "ckpt.pt")
    x = torch.randn(8, 64, device=device)
    loss = (model(x) - x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

if ddp:
    destroy_process_group()
