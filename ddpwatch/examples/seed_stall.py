"""The seed stall: rank-0-only validation calls the DDP wrapper, so DDP.forward's buffer broadcast hangs the job.

Run it under any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun, `ddpwatch demo`).
`--fixed` calls `self.encoder.module(input)` instead, and the job finishes.
"""

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

import ddpwatch


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    )


def loader(samples, seed):
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(samples, 3, 16, 16, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return DataLoader(TensorDataset(data, labels), batch_size=8)


class Trainer:
    def __init__(self, fixed, mark=False):
        self.fixed, self.mark = fixed, mark
        self.encoder = DistributedDataParallel(small_cnn())
        self.optimizer = torch.optim.SGD(self.encoder.parameters(), lr=0.01)
        self.CELoss = nn.CrossEntropyLoss()
        self.train_loader = loader(32, seed=torch.distributed.get_rank())
        self.val_loader = loader(24, seed=100)

    def validation(self):
        losses = []
        with torch.no_grad():
            for _, data in enumerate(tqdm(self.val_loader, desc="validation", file=sys.stderr)):
                input, gt = data[0], data[1]
                if self.fixed:
                    outputs = self.encoder.module(input)
                else:
                    outputs = self.encoder(input)  # noqa: DDP001 - the seed's bug, on purpose  # LINE:seed_ddp_call
                losses.append(self.CELoss(outputs, gt))
        return sum(losses) / len(losses)

    def train(self, epochs):
        for epoch in range(epochs):
            for input, gt in self.train_loader:
                output = self.encoder(input)
                loss = self.CELoss(output, gt)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                torch.distributed.barrier()
            if torch.distributed.get_rank() == 0:
                self.mark_hang_forms()
                val_loss = self.validation()
                torch.save(self.encoder.state_dict(), os.path.join(tempfile.gettempdir(), "seed_stall.pt"))
                print(f"epoch {epoch}: validation loss {val_loss:.3f}", file=sys.stderr, flush=True)
            torch.distributed.barrier()  # LINE:seed_epoch_barrier

    def mark_hang_forms(self):
        # Only under --mark (tests, benchmarks): the time the hang forms, read to measure time to verdict.
        if self.mark:
            print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fixed", action="store_true", help="call model.module(x) for rank-local validation")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--mark", action="store_true",
                        help="print 'DDPWATCH-MARK hang-forms <epoch seconds>' to stderr as the hang forms")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with ddpwatch.guard():
        torch.distributed.init_process_group("gloo")
        Trainer(args.fixed, args.mark).train(args.epochs)
        torch.distributed.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
