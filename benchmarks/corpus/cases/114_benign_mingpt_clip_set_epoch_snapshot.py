"""pytorch/examples minGPT-ddp Trainer: clip_grad_norm_, sampler.set_epoch, rank-0 snapshots, DDP eval; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/examples/blob/1b36393d6eb1e909efb321eaea7facf473c7e1c4/distributed/minGPT-ddp/mingpt/trainer.py",
    "summary": "The minGPT-ddp Trainer: DataLoaders over DistributedSampler (drop_last=False: the sampler pads "
    "the dataset so every rank gets the same number of batches, the last one short), set_epoch each epoch, "
    "backward then clip_grad_norm_ then step, rank 0 alone saves a snapshot of model.module every "
    "save_every epochs, then every rank runs the eval epoch through the DDP model with grad disabled. A "
    "correct program (plus a per-epoch StepLR): the ranks stay in lockstep, rank 1 just runs ahead into "
    "the next epoch's first all-reduce while rank 0 writes.",
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

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class TinyLM(nn.Module):
    def __init__(self, vocab=16, width=24):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.body = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        logits = self.head(self.body(self.emb(idx)))
        loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 16, (n, 6), generator=g)
    return TensorDataset(x, (x + 1) % 16)


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = DDP(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    # 37 and 11 samples: not divisible by 2, DistributedSampler pads so both ranks see the same count.
    train_loader = DataLoader(make_dataset(37, 1), batch_size=4, sampler=DistributedSampler(make_dataset(37, 1)))
    test_loader = DataLoader(make_dataset(11, 2), batch_size=4, sampler=DistributedSampler(make_dataset(11, 2)))
    snapshot_path = os.path.join(tempfile.gettempdir(), f"snapshot_{os.environ['MASTER_PORT']}.pt")
    grad_norm_clip, save_every = 1.0, 2

    def run_epoch(epoch, loader, train):
        loader.sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for source, targets in loader:
            with torch.set_grad_enabled(train):
                _, loss = model(source, targets)
            if train:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_norm_clip)
                optimizer.step()
            total += loss.item()
            batches += 1
        return total / batches, batches

    for epoch in range(1, 5):
        train_loss, n_train = run_epoch(epoch, train_loader, train=True)
        scheduler.step()
        if rank == 0 and epoch % save_every == 0:
            snapshot = {"model_state": model.module.state_dict(), "optimizer_state": optimizer.state_dict()}
            torch.save(snapshot, snapshot_path)
            time.sleep(1.0)  # slow storage; rank 1 goes on to eval and the next epoch's first all-reduce
        eval_loss, n_eval = run_epoch(epoch, test_loader, train=False)
        print(
            f"[rank{rank}] epoch {epoch} {n_train} train batches loss {train_loss:.4f}, "
            f"{n_eval} eval batches loss {eval_loss:.4f}",
            flush=True,
        )
    dist.barrier()
    if rank == 0:
        os.remove(snapshot_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
