"""talmolab/sleap-nn#437: a callback returns early on non-zero ranks, which never reach its strategy.barrier()."""

EXPECT = {
    "source": "https://github.com/talmolab/sleap-nn/pull/437",
    "summary": "'Fix DDP synchronization in training callbacks': training froze after each epoch because "
               "non-rank-0 processes returned early from the callback while rank 0 reached "
               "trainer.strategy.barrier(), which requires all ranks.",
    "family": "collective",
    "world_size": 2,
    "kind": "skipped_collective",
    "ranks": [1],
    "line": "callback_barrier",
    "fix": ["return", "every rank"],
}

import sys
import tempfile
import time
import warnings

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def mark():
    # Printed where each rank may block: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class EpochEndEvaluationCallback(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        with torch.no_grad():  # rank-0-only work: evaluate and plot
            pl_module.layer(torch.randn(8, 4))
        mark()
        trainer.strategy.barrier()  # LINE:callback_barrier


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        mark()
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    warnings.filterwarnings("ignore")
    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tempfile.mkdtemp(prefix="corpus-34-"),
                        callbacks=[EpochEndEvaluationCallback()])
    trainer.fit(Regression(), data)


if __name__ == "__main__":
    main()
