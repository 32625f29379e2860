"""Lightning EarlyStopping: per-rank stop decisions reduced with reduce_boolean_decision; all stop together; correct."""

EXPECT = {
    "source": "https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/pytorch/callbacks/early_stopping.py",  # noqa: E501
    "summary": "EarlyStopping._run_early_stopping_check evaluates the monitored value on every rank and then calls "
    "trainer.strategy.reduce_boolean_decision(should_stop, all=False), an all-reduce, so if any rank wants "
    "to stop, every rank stops after the same epoch. Here val_loss is logged WITHOUT sync_dist, so the ranks "
    "see different values: rank 0's stops improving while rank 1's keeps improving; the reduced decision "
    "stops both after the same epoch and fit() returns on both: correct.",
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
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class LitModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        # a rank-local value (no sync_dist): rank 0 plateaus at 1.0, rank 1 keeps improving
        epoch = self.current_epoch
        value = 1.0 if self.global_rank == 0 and epoch >= 1 else 2.0 / (epoch + 1)
        self.log("val_loss", torch.tensor(value))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 4, generator=gen)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def main():
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    L.seed_everything(0, verbose=False)
    early_stop = EarlyStopping(monitor="val_loss", mode="min", patience=1, min_delta=0.0)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=DDPStrategy(process_group_backend="gloo"),
        devices=int(os.environ["WORLD_SIZE"]),
        max_epochs=10,
        callbacks=[early_stop],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(LitModel(), loader(1), loader(2))
    rank = trainer.global_rank
    print(f"[rank{rank}] stopped after epoch {early_stop.stopped_epoch}, epochs run {trainer.current_epoch}")
    trainer.strategy.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
