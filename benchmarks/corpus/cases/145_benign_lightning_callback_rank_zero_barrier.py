"""Ray Train RayTrainReportCallback: epoch-end save_checkpoint on all ranks, barrier, rank-0 cleanup; correct."""

EXPECT = {
    "source": "https://github.com/ray-project/ray/blob/master/python/ray/train/lightning/_lightning_utils.py",
    "summary": "Ray's Lightning callback calls trainer.save_checkpoint on every worker at train epoch end (Lightning "
    "writes on rank 0 only, inside its own barrier), reports, then calls trainer.strategy.barrier() so all "
    "workers are done before local rank 0 removes the folder. This program adds the same shape at "
    "on_validation_epoch_end: a @rank_zero_only summary writer that takes a moment while the other rank "
    "waits in trainer.strategy.barrier(). Every rank reaches every barrier: correct.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import json
import logging
import os
import shutil
import tempfile
import time
import warnings

import lightning as L
import torch
import torch.distributed as dist
import torch.nn as nn
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, TensorDataset


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self.net(x).argmax(dim=1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


class ReportCallback(L.Callback):
    def __init__(self):
        self.folder = None

    def setup(self, trainer, pl_module, stage):
        # rank 0 picks the folder, the others learn it by broadcast
        folder = tempfile.mkdtemp(prefix="lit_report_") if trainer.is_global_zero else None
        self.folder = trainer.strategy.broadcast(folder)

    @rank_zero_only
    def write_summary(self, trainer):
        time.sleep(1.0)  # slow shared filesystem: the other rank waits in the barrier below
        metrics = {k: round(v.item(), 4) for k, v in trainer.callback_metrics.items()}
        with open(os.path.join(self.folder, f"val_{trainer.current_epoch}.json"), "w") as f:
            json.dump(metrics, f)

    def on_validation_epoch_end(self, trainer, pl_module):
        self.write_summary(trainer)
        trainer.strategy.barrier()

    def on_train_epoch_end(self, trainer, pl_module):
        ckpt_dir = os.path.join(self.folder, str(trainer.current_epoch))
        if trainer.is_global_zero:
            os.makedirs(ckpt_dir, exist_ok=True)
        trainer.save_checkpoint(os.path.join(ckpt_dir, "checkpoint.ckpt"), weights_only=False)  # every rank calls
        trainer.strategy.barrier()
        if trainer.is_global_zero:
            shutil.rmtree(ckpt_dir)


def loader(n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen)
    return DataLoader(TensorDataset(x, x[:, :3].argmax(dim=1)), batch_size=4)


def main():
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    L.seed_everything(0, verbose=False)
    report = ReportCallback()
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=DDPStrategy(process_group_backend="gloo"),
        devices=int(os.environ["WORLD_SIZE"]),
        max_epochs=2,
        callbacks=[report],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(LitClassifier(), loader(32, 1), loader(16, 2))
    rank = trainer.global_rank
    summaries = sorted(os.listdir(report.folder)) if trainer.is_global_zero else []
    val = trainer.callback_metrics["val_acc"].item()
    print(f"[rank{rank}] val_acc {val:.4f} summaries {summaries}")
    trainer.strategy.barrier()
    if trainer.is_global_zero:
        shutil.rmtree(report.folder)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
