"""talmolab/sleap-nn#471: a controller callback sets trainer.should_stop on global zero only."""

EXPECT = {
    "source": "https://github.com/talmolab/sleap-nn/pull/471",
    "summary": "'Fix TrainingControllerZMQ DDP stop: use reduce_boolean_decision': when a Stop Early command "
               "arrives over ZMQ, rank 0 (is_global_zero) receives it and sets trainer.should_stop = True; all "
               "ranks then reach trainer.strategy.barrier(), which synchronises position but does not propagate "
               "should_stop, so afterwards rank 0 exits the training loop while the other ranks go on and "
               "deadlock (distilled: Lightning 2.x on CPU, the ZMQ socket replaced by a message queue that "
               "delivers the stop command after batch 3).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [0],
    "line": "should_stop_set",
    "fix": ["reduce_boolean_decision", "broadcast", "all_reduce"],
}

import collections
import os
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


class FakeControllerSocket:
    """Stands in for the ZMQ SUB socket the GUI publishes commands on: a 'stop' arrives after batch 3."""

    def __init__(self):
        self.batches_seen = 0
        self.inbox = collections.deque()

    def poll(self):
        self.batches_seen += 1
        if self.batches_seen == 4:
            self.inbox.append({"command": "stop"})
        return self.inbox.popleft() if self.inbox else None


class TrainingControllerZMQ(L.Callback):
    def __init__(self):
        self.socket = FakeControllerSocket()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.is_global_zero:
            message = self.socket.poll()
            if message is not None and message["command"] == "stop":
                print("Received stop command from the controller", file=sys.stderr, flush=True)
                trainer.should_stop = True  # LINE:should_stop_set
        mark()
        trainer.strategy.barrier()


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
    root = tempfile.mkdtemp(prefix="corpus-75-")
    generator = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator)),
                      batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=root, callbacks=[TrainingControllerZMQ()])
    trainer.fit(Regression(), data)
    mark()
    trainer.save_checkpoint(os.path.join(root, "final.ckpt"))  # every rank takes part in saving


if __name__ == "__main__":
    main()
