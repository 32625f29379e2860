"""dvl-tum/center-group#2: validation metrics logged only when world_rank == 0, with sync, deadlock Lightning."""

EXPECT = {
    "source": "https://github.com/dvl-tum/center-group/pull/2",
    "summary": "'Fix validation logging when using multiple GPUs': since the module only logs when "
               "world_rank == 0, it has to pass rank_zero_only=True to self.log(); otherwise it deadlocks, as "
               "Lightning waits for the other processes to log as well.",
    "family": "collective",
    "world_size": 2,
    "kind": "collective_on_subset",
    "ranks": [0],
    "line": "log_rank0",
    "fix": ["rank_zero_only"],
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
    # Printed before each step and the synced log call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class CenterGroup(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        mark()
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        if self.global_rank == 0:
            mark()
            self.log("val_loss", loss, sync_dist=True)  # LINE:log_rank0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(seed):
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=generator), torch.randn(16, 1, generator=generator)),
                      batch_size=4)


def main():
    warnings.filterwarnings("ignore")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=tempfile.mkdtemp(prefix="corpus-33-"))
    trainer.fit(CenterGroup(), loader(0), loader(1))


if __name__ == "__main__":
    main()
