"""What forged incidents cost a job: epochs trained with someone on the store port opening one every 0.5 s, vs none.

    python -m benchmarks.forged_incidents [--quick] [--seconds S] [--rounds N] [--every S]

Anyone who reaches the job's TCPStore port can raise ddpwatch's incident counter; every rank then answers. This
runs 2 gloo ranks of a small DDP model under ddpwatch (action=report) for S seconds on a store this process hosts,
with and without a forger that opens an incident every `--every` seconds (trigger "dump", which asks running ranks
for their native stacks too), in the order none, forged, forged, none per round (--quick: none, then forged, once:
a smoke test), and prints the epochs of each run and the ratio of the medians. Issue 27: every 0.5 s took a job
from 581 to 225 epochs (py-spy on every rank for every incident).
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import tempfile
import threading
import time

from . import _common as C

NAMESPACE = "0//ddpwatch/v1/job/g0"  # torch's "0/" prefix for the default group's store; no launcher job id


def worker(seconds: float) -> None:
    import os

    import torch
    import torch.distributed as dist

    import ddpwatch

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", int(os.environ["STORE_PORT"]), 2, False, timeout=datetime.timedelta(seconds=30))
    with ddpwatch.guard():
        dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]), world_size=2)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        end, epochs = time.monotonic() + seconds, 0
        while True:
            for _ in range(10):
                loss = model(torch.randn(64, 64)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            flag = torch.tensor([1.0 if time.monotonic() < end else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank agrees when to stop
            if flag.item() == 0.0:
                break
            epochs += 1
        dist.destroy_process_group()
    C.emit({"rank": dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"]), "epochs": epochs})


def forge(store, every: float, stop: threading.Event) -> int:
    """Open an incident every `every` seconds until `stop`; returns how many."""
    from ddpwatch.watch.store import INCIDENT_UNIT

    opened = 0
    while not stop.wait(every):
        try:
            number = store.add(f"{NAMESPACE}/counters", INCIDENT_UNIT) // INCIDENT_UNIT
            store.set(
                f"{NAMESPACE}/incident/{number}/info",
                json.dumps({"trigger": "dump", "leader": 0, "action": "report", "fingerprint": "forged"}),
            )
            opened += 1
        except Exception:
            return opened  # the job ended and took nothing with it: the store is this process's
    return opened


def one_run(seconds: float, forged: bool, every: float) -> tuple:
    import torch.distributed as dist

    from ddpwatch.launch import free_port, run_ranks

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    stop, opened = threading.Event(), []
    forger = threading.Thread(target=lambda: opened.append(forge(store, every, stop)), daemon=True)
    if forged:
        forger.start()
    reports = tempfile.TemporaryDirectory(prefix="ddpwatch-forged-")  # what the ranks write; gone after the run
    env = C.child_env(STORE_PORT=port, DDPWATCH_DIR=reports.name, DDPWATCH_ACTION="report")
    try:
        results = run_ranks(
            [sys.executable, "-m", "benchmarks.forged_incidents", "--worker", "--seconds", str(seconds)],
            2,
            env=env,
            timeout=seconds + 120,
            cwd=C.ROOT,
        )
    finally:
        stop.set()
        if forged:
            forger.join(10)
        reports.cleanup()
    docs = [doc for r in results for doc in C.parse_results(r.stdout)]
    epochs = min((doc["epochs"] for doc in docs), default=None) if len(docs) == 2 else None
    return epochs, (opened or [0])[0], [r.returncode for r in results]


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--seconds", type=float, default=None, help="training time per run (default 30, quick 8)")
    args.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of none/forged/forged/none (default 3; --quick: one run of each)",
    )
    args.add_argument("--every", type=float, default=0.5, help="seconds between two forged incidents")
    args.add_argument("--worker", action="store_true", help=argparse_hidden())
    opts = args.parse_args(argv)
    seconds = opts.seconds or (8.0 if opts.quick else 30.0)
    if opts.worker:
        worker(seconds)
        return 0
    C.header("forged_incidents", opts.quick)
    # --quick is a smoke test (no figure is quoted from it): one run each way, not a round of four.
    order = [False, True] if opts.quick and opts.rounds is None else C.abba(opts.rounds or 3)
    rows, epochs = [], {False: [], True: []}
    for forged in order:
        count, opened, codes = one_run(seconds, forged, opts.every)
        rows.append(["forged" if forged else "none", seconds, opened, count, ",".join(map(str, codes))])
        if count is not None:
            epochs[forged].append(count)
    C.print_table(
        f"Epochs in {seconds:g} s on 2 gloo ranks, an incident forged every {opts.every:g} s or none",
        ["incidents", "seconds", "incidents forged", "epochs", "exit codes"],
        rows,
    )
    if epochs[False] and epochs[True]:
        ratio = statistics.median(epochs[True]) / statistics.median(epochs[False])
        print(f"forged / none, medians: {ratio:.3f} ({(1 - ratio) * 100:+.1f}% fewer epochs under forgery)")
    return 0 if epochs[False] and epochs[True] else 1


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
