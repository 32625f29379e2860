"""Training-step cost of the guard measured where this noisy machine can resolve it: one process, CPU time.

    python -m benchmarks.step_cost [--quick]

A DDP training step (CNN with BatchNorm, SGD step, barrier, metric all_reduce) on a 1-rank gloo group, so no peer
adds noise: (1) the thread's CPU time per step with and without the guard, in A/B/B/A blocks, min and median;
(2) how many records ddpwatch opens per step (exact), which times the wrapper's own cost from overhead_ops
(fake process group) estimates its share. (cProfile was tried and dropped: its per-call overhead on the
wrapper's many tiny builtin calls inflated ddpwatch's share several-fold.)
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time

from . import _common as C


def build():
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from ddpwatch.launch import free_port

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(256, 10),
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, labels = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def step():
        loss = nn.functional.cross_entropy(model(data), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dist.barrier()
        dist.all_reduce(loss.detach())

    return step


def cpu_per_step(step, steps: int) -> float:
    start = time.thread_time()
    for _ in range(steps):
        step()
    return (time.thread_time() - start) / steps * 1e6


def main(argv=None) -> int:
    opts = C.parser(__doc__).parse_args(argv)
    C.header("step_cost", opts.quick)
    import ddpwatch

    step = build()
    for _ in range(20):
        step()
    rounds, steps = (3, 20) if opts.quick else (20, 50)
    off, on = [], []
    for _ in range(rounds):
        off.append(cpu_per_step(step, steps))
        for _ in range(2):
            ddpwatch.install()
            on.append(cpu_per_step(step, steps))
            ddpwatch.uninstall()
        off.append(cpu_per_step(step, steps))
    session = ddpwatch.install()
    before = session.recorder.progress
    for _ in range(steps):
        step()
    records_per_step = (session.recorder.progress - before) / 2 / steps  # progress counts each begin and finish
    ddpwatch.uninstall()
    C.print_table(
        "Training step on 1 rank: thread CPU per step, guard off/on (A/B/B/A blocks)",
        [
            "step CPU off, min (us)",
            "on, min (us)",
            "added, min-based (us)",
            "off, median",
            "on, median",
            "added, median-based (us)",
            "records per step",
        ],
        [
            [
                f"{min(off):.0f}",
                f"{min(on):.0f}",
                f"{min(on) - min(off):.0f}",
                f"{statistics.median(off):.0f}",
                f"{statistics.median(on):.0f}",
                f"{statistics.median(on) - statistics.median(off):.0f}",
                f"{records_per_step:g}",
            ]
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
