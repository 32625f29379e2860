"""TorchMetrics in Lightning docs: self.log(metric object); Lightning computes it on every rank, resets; correct."""

EXPECT = {
    "source": "https://lightning.ai/docs/torchmetrics/stable/pages/lightning.html",
    "summary": "The TorchMetrics-in-Lightning guide logs the Metric object itself (self.log('val_acc', "
    "self.val_acc)) after updating it in each step; at epoch end Lightning calls metric.compute() on EVERY "
    "rank (the state all-gather) and then reset(). The training metric is logged per step with on_epoch=True. "
    "Every rank runs the same hooks, so the metric syncs match: correct (the opposite of computing the "
    "metric inside an `if trainer.is_global_zero` block).",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import logging
import os
import warnings

import lightning as L
import torch
import torch.distributed as dist
import torch.nn as nn
import torchmetrics
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class LitClassifier(L.LightningModule):
    def __init__(self, num_classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, num_classes))
        self.train_acc = torchmetrics.classification.Accuracy(task="multiclass", num_classes=num_classes)
        self.val_acc = torchmetrics.classification.Accuracy(task="multiclass", num_classes=num_classes)
        self.epoch_values = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True)
        return nn.functional.cross_entropy(logits, y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_acc.update(self.net(x), y)
        self.log("val_acc", self.val_acc, on_epoch=True)  # Lightning computes + resets it at epoch end

    def on_validation_epoch_end(self):
        self.epoch_values.append(self.trainer.callback_metrics.get("val_acc"))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


def loader(n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen)
    return DataLoader(TensorDataset(x, x[:, :3].argmax(dim=1)), batch_size=4)


def main():
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    L.seed_everything(0, verbose=False)
    model = LitClassifier()
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=DDPStrategy(process_group_backend="gloo"),
        devices=int(os.environ["WORLD_SIZE"]),
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, loader(32, 1), loader(20, 2))
    rank = trainer.global_rank
    metrics = trainer.callback_metrics
    print(
        f"[rank{rank}] train_acc_epoch {metrics['train_acc_epoch'].item():.4f} "
        f"val_acc {metrics['val_acc'].item():.4f} per-epoch val {[round(float(v), 4) for v in model.epoch_values]}"
    )
    trainer.strategy.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
