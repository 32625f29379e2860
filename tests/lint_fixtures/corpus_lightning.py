"""Correct PyTorch Lightning module: rank-zero-only printing and logging, collectives left to Lightning."""

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.utilities import rank_zero_only


class LitClassifier(pl.LightningModule):
    def __init__(self, hidden=64):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(28 * 28, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x.view(x.size(0), -1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        acc = (logits.argmax(dim=1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True)
        if self.trainer.is_global_zero and batch_idx == 0:
            self.print(f"first val batch acc {acc:.3f}")

    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            self.log("epoch_marker", float(self.current_epoch), rank_zero_only=True)
        if self.global_rank == 0:
            self.print("validation done")

    @rank_zero_only
    def dump_config(self):
        print(self.hparams)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main():
    model = LitClassifier()
    trainer = pl.Trainer(accelerator="gpu", devices=4, strategy="ddp", max_epochs=5)
    trainer.fit(model)
    if trainer.is_global_zero:
        trainer.save_checkpoint("final.ckpt")


if __name__ == "__main__":
    main()
