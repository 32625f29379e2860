"""The seed stall without ddpwatch and with a short process-group timeout: what torch alone ends with, and when."""

import argparse
import datetime
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

# The same model and data as the demo's script; importing it imports ddpwatch but patches nothing.
from ddpwatch.examples.seed_stall import loader, small_cnn


def train(model, epochs):
    """ddpwatch/examples/seed_stall.py's loop: rank-0-only validation through the DDP wrapper."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for inputs, labels in loader(32, seed=dist.get_rank()):
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            dist.barrier()
        if dist.get_rank() == 0:
            print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
            with torch.no_grad():
                for inputs, _ in loader(24, seed=100):
                    model(inputs)  # the seed's bug: the DDP wrapper, on rank 0 only
        dist.barrier()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=20.0, help="process-group timeout in seconds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    try:
        train(DistributedDataParallel(small_cnn()), epochs=2)
    except Exception as exc:
        # The moment and the words torch ends with: what a user would have to go on without ddpwatch.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"BENCH-MARK error {time.time():.3f} {type(exc).__name__}: {first}", file=sys.stderr, flush=True)
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
