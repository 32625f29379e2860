"""Lightning docs (sync validation logging): Trainer ddp, self.log(sync_dist=True), ModelCheckpoint; correct."""

EXPECT = {
    "source": "https://lightning.ai/docs/pytorch/stable/accelerators/accelerator_prepare",
    "summary": "Lightning's docs ask for self.log(..., sync_dist=True) in validation_step so the epoch value is "
    "reduced across processes; ModelCheckpoint then monitors that synced value and rank 0 writes the "
    "checkpoint while the others wait in the strategy barrier. Here the launcher starts the processes itself "
    "(LOCAL_RANK set, so LightningEnvironment does not spawn), Trainer(strategy='ddp', devices=WORLD_SIZE) "
    "trains two short epochs with validation on every rank: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import logging
import os
import shutil
import tempfile
import warnings

import lightning as L
import torch
import torch.distributed as dist
import torch.nn as nn
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class LitRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("val_loss", loss, sync_dist=True)  # all-reduced across ranks at epoch end

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader(n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def main():
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    world = int(os.environ["WORLD_SIZE"])
    L.seed_everything(0, verbose=False)
    model = LitRegressor()
    folder = tempfile.mkdtemp(prefix="lit_ckpt_")  # each rank its own; only rank 0 writes into its own
    checkpoint = ModelCheckpoint(dirpath=folder, monitor="val_loss", mode="min", save_top_k=1)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=DDPStrategy(process_group_backend="gloo"),
        devices=world,
        num_nodes=1,
        max_epochs=2,
        callbacks=[checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, loader(32, 1), loader(16, 2))
    rank = trainer.global_rank
    val = trainer.callback_metrics["val_loss"].item()
    saved = len(os.listdir(folder))
    print(f"[rank{rank}] epochs {trainer.current_epoch} val_loss {val:.4f} checkpoints here {saved}")
    trainer.strategy.barrier()
    shutil.rmtree(folder, ignore_errors=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
