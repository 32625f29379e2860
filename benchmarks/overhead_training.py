"""Step-time overhead of the guard on a small DDP loop (2 gloo ranks), beside Flight Recorder on/off, DEBUG=DETAIL."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time

from . import _common as C

SIZES = {"full": (50, 10), "quick": (8, 1)}  # (steps per block, A/B/B/A rounds): 1,000 steps per side in full
TARGET_RATIO = 1.01
# Step by step: (pairs of steps, each pair one unguarded and one guarded step of the same kind). Blocks of 50 steps
# swing by +-15% of a step here; step by step the two sides share every drift.
INTERLEAVED = {"full": 4000, "quick": 20}
# wall: the step time; thread: CPU of the training thread (forward, backward, the guard's wrappers; not affected
# by other processes the way wall time is); process: CPU of every thread (gloo's and the watchdog's too).
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time, "process": time.process_time}
# The python recorder, whatever DDPWATCH_RECORDER says: this benchmark attributes a step's cost by taking the
# wrappers off and putting them back; the flight recorder's record is the watchdog's reads, which no such switch
# pauses (its cost is benchmarks/whole_job's, on whole runs).
PYTHON = "python"
# name -> (extra environment, whether the guard is toggled A/B/B/A in that run)
CONFIGS = {
    "Flight Recorder on (default, 2000 entries)": ({}, True),
    "Flight Recorder off (TORCH_FR_BUFFER_SIZE=0)": ({"TORCH_FR_BUFFER_SIZE": "0"}, True),
    "TORCH_DISTRIBUTED_DEBUG=DETAIL (no guard)": ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, False),
}
QUICK_CONFIGS = ("Flight Recorder on (default, 2000 entries)", "TORCH_DISTRIBUTED_DEBUG=DETAIL (no guard)")


def small_cnn():
    """The seed's model shape (Conv + BatchNorm), a little wider so a step is not all Python overhead."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


ACCUMULATE = 2  # micro-steps per optimizer step: every other backward runs under no_sync()


def make_step():
    """One training micro-step as a benign DDP loop does it: BatchNorm, gradient accumulation (no_sync on all but
    the last micro-step), the optimizer and a barrier on the synced one, and a metric all_reduce every step."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(small_cnn())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(dist.get_rank())
    inputs, labels = torch.randn(16, 3, 32, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator)

    def step(index: int = ACCUMULATE - 1):
        synced = (index + 1) % ACCUMULATE == 0
        with contextlib.nullcontext() if synced else model.no_sync():
            loss = loss_fn(model(inputs), labels)
            loss.backward()
        if synced:
            optimizer.step()
            optimizer.zero_grad()
            dist.barrier()
        metric = loss.detach().clone()
        dist.all_reduce(metric)

    return step


def block(step, steps: int) -> dict:
    """Milliseconds per step over one block (started together on both ranks), on every clock."""
    import torch.distributed as dist

    dist.barrier()
    start = {name: clock() for name, clock in CLOCKS.items()}
    for index in range(steps):
        step(index)
    return {name: (clock() - start[name]) / steps * 1e3 for name, clock in CLOCKS.items()}


def fr_entries():
    """How many Flight Recorder entries this rank holds (proof that the FR setting took), or None."""
    import torch

    try:
        return len(json.loads(torch._C._distributed_c10d._dump_fr_trace_json()).get("entries", []))
    except Exception:
        return None


def worker(steps: int, rounds: int, toggle: bool) -> None:
    import torch
    import torch.distributed as dist

    import ddpwatch

    torch.set_num_threads(1)
    # A short process-group timeout: if a peer crashes (DETAIL), the survivor errors out instead of waiting 30 min.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    step = make_step()
    print("BENCH-MARK ddp-constructed", flush=True)
    for index in range(4):
        step(index)  # warm-up: bucket rebuild, first-call costs
    times = {False: [], True: []}
    for guarded in C.abba(rounds):
        guarded = guarded and toggle
        if guarded:
            ddpwatch.install(recorder=PYTHON)
        times[guarded].append(block(step, steps))
        if guarded:
            ddpwatch.uninstall()
    entries = fr_entries()
    dist.barrier()
    dist.destroy_process_group()
    C.emit(
        {
            "rank": int(os.environ["RANK"]),
            "fr_entries": entries,
            "times": {
                clock: {"off": [b[clock] for b in times[False]], "on": [b[clock] for b in times[True]]}
                for clock in CLOCKS
            },
        }
    )


def interleaved_worker(pairs: int) -> None:
    """The guard installed throughout (the watchdog runs for both sides: its own cost is its CPU per second, printed
    beside); its patches put aside for the unguarded step of each pair and back for the guarded one, in A/B/B/A
    order per pair. Both steps of a pair are the same kind of micro-step (no_sync or synced)."""
    import torch
    import torch.distributed as dist

    import ddpwatch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    step = make_step()
    session = ddpwatch.install(recorder=PYTHON)
    for index in range(10):
        step(index)  # warm-up, guarded: bucket rebuild, first-call costs, the lazily hooked Work.wait
    patches = session.patcher.patches

    def put_aside() -> tuple:
        """Every patch off (the originals back); the returned patches go back on with put_back()."""
        made = patches.made()
        for owner, attribute, _, original in reversed(made):
            setattr(owner, attribute, original)
        return made

    def put_back(made: tuple) -> None:
        for owner, attribute, wrapper, _ in made:
            setattr(owner, attribute, wrapper)

    progress, made = session.recorder.progress, put_aside()
    step(0)
    step(1)
    put_back(made)
    if session.recorder.progress != progress:
        raise SystemExit("an unguarded step recorded a collective: it is not unguarded")
    watchdog, cpu = session.watchdog, 0.0
    cpu = C.thread_cpu(watchdog) if watchdog is not None else 0.0
    started = time.perf_counter()
    samples = {False: [], True: []}
    for index in range(pairs):
        # The kind of micro-step alternates with the pair (no_sync, synced), and the first step of a pair follows
        # a step of the other kind, which costs it more: the order turns every two pairs, so each side goes first
        # as often in each kind (turning every pair made "first" and "no_sync" the same pairs: a 7-12% artefact).
        for guarded in (False, True) if (index // 2) % 2 == 0 else (True, False):
            made = None if guarded else put_aside()  # outside the clocks, like the guarded side's install
            dist.barrier()  # both ranks start each step together, as blocks do
            start = {name: clock() for name, clock in CLOCKS.items()}
            step(index)
            samples[guarded].append({name: clock() - start[name] for name, clock in CLOCKS.items()})
            if made is not None:
                put_back(made)
    watchdog_us_per_s = (
        (C.thread_cpu(watchdog) - cpu) / (time.perf_counter() - started) * 1e6 if watchdog is not None else None
    )
    ddpwatch.uninstall()
    dist.barrier()
    dist.destroy_process_group()
    C.emit(
        {
            "rank": int(os.environ["RANK"]),
            "pairs": pairs,
            "watchdog_us_per_s": watchdog_us_per_s,
            "samples": {
                clock: {"off": [s[clock] for s in samples[False]], "on": [s[clock] for s in samples[True]]}
                for clock in CLOCKS
            },
        }
    )


def run_interleaved(mode: str) -> None:
    from ddpwatch.launch import run_ranks

    pairs = INTERLEAVED[mode]
    command = [sys.executable, "-m", "benchmarks.overhead_training", "--worker", str(pairs), "0", "interleaved"]
    ranks = run_ranks(command, 2, env=C.child_env(), timeout=900 if mode == "full" else 180, cwd=C.ROOT)
    results = [doc for r in ranks for doc in C.parse_results(r.stdout)]
    if len(results) != 2:
        raise SystemExit("interleaved ranks failed: " + describe_failure(ranks))
    rows, wall = [], None
    for clock in CLOCKS:
        off = [sum(v) / 2 for v in zip(*(r["samples"][clock]["off"] for r in results))]
        on = [sum(v) / 2 for v in zip(*(r["samples"][clock]["on"] for r in results))]
        diffs = [b - a for a, b in zip(off, on)]
        mean_off, added = sum(off) / len(off), sum(diffs) / len(diffs)
        stderr = (sum((d - added) ** 2 for d in diffs) / max(1, len(diffs) - 1) / len(diffs)) ** 0.5
        stats = {
            "off": mean_off * 1e3,
            "added": added * 1e6,
            "stderr": stderr * 1e6,
            "percent": added / mean_off * 100,
            "percent_stderr": stderr / mean_off * 100,
        }
        wall = stats if clock == "wall" else wall
        rows.append(
            [
                clock,
                stats["off"],
                f"{stats['added']:.0f} +- {stats['stderr']:.0f}",
                f"{stats['percent']:+.2f}% +- {stats['percent_stderr']:.2f}%",
            ]
        )
    watchdog = sum(r["watchdog_us_per_s"] or 0.0 for r in results) / 2
    C.print_table(
        f"The same DDP loop, step by step: {pairs} pairs of micro-steps, each pair one step without the "
        f"guard's patches and one with them (A/B/B/A by pair, the same kind of micro-step), the guard "
        f"installed throughout; means over the pairs and both ranks, +- the standard error",
        ["clock", "without (ms/step)", "added (us/step)", "added (% of the step)"],
        rows,
    )
    print(
        f"the watchdog thread used {watchdog:.0f} us of CPU per second meanwhile ({watchdog / 1e4:.3f}% of one "
        f"core), on both sides alike: at most that much more of the loop's time"
    )
    bound = wall["percent"] + 2 * wall["percent_stderr"] + watchdog / 1e4
    verdict = (
        "undecided: two standard errors are not below 1%"
        if 2 * wall["percent_stderr"] >= 1.0
        else "met"
        if bound < (TARGET_RATIO - 1) * 100
        else "NOT met"
    )
    print(
        f"target: training-loop time within 1% of unguarded, spread below 1%: wall {wall['percent']:+.2f}% "
        f"+- {wall['percent_stderr']:.2f}% per step, plus at most {watchdog / 1e4:.3f}% for the watchdog thread "
        f"(upper bound {bound:+.2f}%): {verdict}\n"
    )


def run_config(name: str, mode: str, rounds: int | None = None) -> dict:
    """One launch of 2 ranks; a crash is a result (DETAIL segfaults at DDP construction on gloo in 2.13)."""
    from ddpwatch.launch import run_ranks

    extra, toggle = CONFIGS[name]
    steps, default_rounds = SIZES[mode]
    rounds = rounds or default_rounds
    command = [
        sys.executable,
        "-m",
        "benchmarks.overhead_training",
        "--worker",
        str(steps),
        str(rounds),
        "1" if toggle else "0",
    ]
    limit = (300 if mode == "full" else 120) * max(1, rounds // default_rounds)
    ranks = run_ranks(command, 2, env=C.child_env(**extra), timeout=limit, cwd=C.ROOT)
    results = [doc for r in ranks for doc in C.parse_results(r.stdout)]
    outcome = "finished" if len(results) == 2 else describe_failure(ranks)
    return {"name": name, "toggle": toggle, "results": results, "outcome": outcome}


def describe_failure(ranks) -> str:
    parts = []
    for r in ranks:
        code = r.returncode
        how = (
            "killed at the time limit"
            if code == -signal.SIGKILL
            else (f"signal {signal_name(-code)}" if code is not None and code < 0 else f"exit {code}")
        )
        constructed = "after" if "ddp-constructed" in r.stdout else "before"
        last = last_error_line(r.stderr)
        parts.append(f"rank {r.rank}: {how}, {constructed} DDP was constructed" + (f" ({last})" if last else ""))
    return "; ".join(parts)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or "fault" in line or "Fatal" in line:
            return line[:200]
    return lines[-1][:200] if lines else ""


def summarize(run: dict, clock: str = "wall"):
    """Per-config statistics on one clock, averaging the two ranks' per-block times."""
    results = run["results"]
    if len(results) != 2:
        return None
    mean = lambda side: [sum(vals) / 2 for vals in zip(*(r["times"][clock][side] for r in results))]
    off = mean("off")
    if not run["toggle"]:
        return {"off": sorted(off)[len(off) // 2], "on": None}
    return C.paired(off, mean("on"))


def row(run: dict) -> list:
    stats = summarize(run)
    entries = sorted({r["fr_entries"] for r in run["results"]}, key=str) if run["results"] else []
    if stats is None:
        return [run["name"]] + [None] * 8 + [run["outcome"]]
    if stats["on"] is None:
        return [run["name"], stats["off"]] + [None] * 6 + [entries, run["outcome"]]
    thread, process = summarize(run, "thread"), summarize(run, "process")
    verdict = " (< 1%)" if stats["ratio"] < TARGET_RATIO else " (>= 1%)"
    return [
        run["name"],
        stats["off"],
        stats["on"],
        stats["added"] * 1e3,
        f"{stats['added_min'] * 1e3:.0f} .. {stats['added_max'] * 1e3:.0f}",
        f"{stats['ratio']:.3f}{verdict}",
        f"{thread['added'] * 1e3:.0f} ({(thread['ratio'] - 1) * 100:+.2f}%)",
        f"{process['added'] * 1e3:.0f} ({(process['ratio'] - 1) * 100:+.2f}%)",
        entries,
        run["outcome"],
    ]


def table(runs: list) -> None:
    C.print_table(
        "Small DDP loop on 2 gloo ranks (CNN + BatchNorm, SGD, gradients accumulated over 2 micro-steps with "
        "no_sync, a barrier per optimizer step, a metric all_reduce per micro-step); "
        "medians of per-round means over both ranks",
        [
            "configuration",
            "wall without guard (ms/step)",
            "wall with guard (ms/step)",
            "wall added (us/step)",
            "wall added, min .. max (us)",
            "wall ratio",
            "main-thread CPU added (us/step)",
            "process CPU added (us/step)",
            "FR entries held",
            "outcome",
        ],
        [row(run) for run in runs],
    )


def main(argv=None) -> None:
    args = C.parser(__doc__)
    args.add_argument("--worker", nargs=3, metavar=("STEPS", "ROUNDS", "TOGGLE"), help=argparse.SUPPRESS)
    args.add_argument("--rounds", type=int, help="A/B/B/A rounds per configuration (more rounds, smaller spread)")
    args.add_argument("--only-default", action="store_true", help="only the default configuration (Flight Recorder on)")
    opts = args.parse_args(argv)
    if opts.worker:
        if opts.worker[2] == "interleaved":
            interleaved_worker(int(opts.worker[0]))
        else:
            worker(int(opts.worker[0]), int(opts.worker[1]), opts.worker[2] == "1")
        return
    mode = "quick" if opts.quick else "full"
    C.header("overhead_training: step time with and without the guard", opts.quick)
    steps, rounds = SIZES[mode]
    rounds = opts.rounds or rounds
    print(
        f"{steps} steps per block, {rounds} A/B/B/A rounds per configuration; each configuration is its own "
        f"launch (the environment is read at start-up)"
    )
    names = QUICK_CONFIGS if opts.quick else tuple(CONFIGS)
    names = names[:1] if opts.only_default else names
    runs = [run_config(name, mode, rounds) for name in names]
    table(runs)
    for run in runs:
        stats = summarize(run) if run["toggle"] else None
        if stats is not None:
            print(
                f"target: training-loop time within 1% of unguarded ({run['name']}): "
                f"{C.ratio_verdict(stats['ratios'], TARGET_RATIO)}"
            )
    on_off = [summarize(run) for run in runs if run["name"].startswith("Flight Recorder")]
    if len(on_off) == 2 and all(on_off):
        print(
            f"Flight Recorder on vs off, without the guard (two launches, so noisier than the A/B/B/A ratios): "
            f"{on_off[0]['off']:.2f} vs {on_off[1]['off']:.2f} ms/step, "
            f"ratio {on_off[0]['off'] / on_off[1]['off']:.3f}"
        )
    run_interleaved(mode)
    if opts.quick:
        print("(quick mode skips: " + ", ".join(n for n in CONFIGS if n not in names) + ")")


if __name__ == "__main__":
    main()
