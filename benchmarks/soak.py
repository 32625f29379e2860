"""Soak: benign training with legitimately uneven work for minutes, a short grace, and zero false alarms expected.

    python -m benchmarks.soak [--quick] [--minutes M]
    python -m benchmarks.soak --corpus [--minutes M] [--recorder R ...]

Rank 0 validates alone each epoch for 90% of ddpwatch's timeout while the others wait at the barrier; every
tenth epoch one all_reduce is made slow (2 s on every rank, and it completes). Nothing here is a hang, so every
report ddpwatch writes is a false alarm. Prints one table row: minutes, epochs, collectives, reports.

`--corpus`: the correct programs of the corpus (benchmarks/corpus, family benign) looped for M minutes under each
recorder, armed with action=abort, a 5 s timeout and a 0.25 s interval (four looks a second where the default
takes one: more chances to cry wolf on short programs): every report, non-zero exit or printed result other than the
plain run's is a false alarm. Prints a row per recorder; exits 1 on any false alarm.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import time

from . import _common as C

TIMEOUT_S = 5.0
BUSY_FRACTION = 0.9


def worker(minutes: float) -> None:
    import torch
    import torch.distributed as dist

    import ddpwatch

    torch.set_num_threads(1)
    with ddpwatch.guard() as session:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        end = time.monotonic() + minutes * 60
        epoch = 0
        longest, past = 0.0, 0  # waits at the barrier measured here: each past TIMEOUT_S calls for one report
        while True:
            for _ in range(20):
                loss = model(torch.randn(32, 16)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                dist.all_reduce(loss.detach())
            if epoch % 10 == 9:
                time.sleep(2.0)  # a slow collective: every rank pays it inside the all_reduce below
            flag = torch.tensor([1.0 if time.monotonic() < end else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank agrees when to stop
            if flag.item() == 0.0:
                break
            if rank == 0:
                deadline = time.monotonic() + BUSY_FRACTION * TIMEOUT_S
                with torch.no_grad():
                    while time.monotonic() < deadline:
                        model.module(torch.randn(32, 16))
            entered = time.monotonic()
            dist.barrier()
            waited = time.monotonic() - entered
            longest, past = max(longest, waited), past + (waited > TIMEOUT_S)
            epoch += 1
        ops = session.recorder.progress // 2
        dist.destroy_process_group()
    measured = f"longest_wait={longest:.3f} past_timeout={past}"
    print(f"{C.RESULT_TAG}rank={rank} epochs={epoch} ops={ops} {measured}", flush=True)


def corpus_soak(minutes: float, recorders: list, interval: float) -> int:
    """The benign corpus looped for `minutes` under each recorder in turn: runs, false alarms, with what they were."""
    from .corpus import __main__ as corpus
    from .corpus import score

    paths = [p for p in score.case_paths() if score.load_expect(p)["family"] == "benign"]
    plain = {path: corpus.run_plain(path, 120.0)[0] for path in paths}  # what each prints unguarded, once
    rows, alarms = [], []
    for recorder in recorders:
        started, runs, rounds = time.monotonic(), 0, 0
        while time.monotonic() - started < minutes * 60:
            for path in paths:
                row = corpus.run_case(path, 120.0, recorder, plain[path], timeout=5.0, interval=interval)
                runs += 1
                if row["false_alarm"]:
                    alarms.append(row)
                    said = row["said"]["kind"] if row["said"] else "no report"
                    print(f"FALSE ALARM {row['case']} [{recorder}]: {said}, exit {row['exit_codes']}", flush=True)
                    for tail in row.get("stderr_tails") or ():
                        print("    " + tail[-800:].replace("\n", "\n    "), flush=True)
                if time.monotonic() - started >= minutes * 60:
                    break
            rounds += 1
        elapsed = (time.monotonic() - started) / 60
        found = sum(1 for a in alarms if a["recorder"] == recorder)
        rows.append([recorder, f"{elapsed:.1f}", len(paths), rounds, runs, found])
    C.print_table(
        f"Soak: the benign corpus looped, action=abort, timeout 5 s, interval {interval:g} s (a round: every case "
        "once; the last may be partial)",
        ["recorder", "minutes", "cases", "rounds", "runs", "false alarms"],
        rows,
    )
    return 1 if alarms else 0


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--minutes", type=float, default=None, help="how long to soak (default 10, quick 0.5)")
    args.add_argument("--worker", action="store_true", help=argparse_hidden())
    args.add_argument("--corpus", action="store_true", help="loop the corpus's correct programs (family benign)")
    args.add_argument("--recorder", nargs="+", default=["python", "flight"], help="--corpus: the recorders, in turn")
    args.add_argument(
        "--interval", type=float, default=0.25, help="--corpus: DDPWATCH_INTERVAL (short: compared more often)"
    )
    opts = args.parse_args(argv)
    minutes = opts.minutes if opts.minutes is not None else (0.5 if opts.quick else 10.0)
    if opts.worker:
        worker(minutes)
        return 0
    if opts.corpus:
        C.header("soak --corpus", opts.quick)
        return corpus_soak(minutes, opts.recorder, opts.interval)
    C.header("soak", opts.quick)
    from ddpwatch.launch import run_ranks

    report_dir = tempfile.mkdtemp(prefix="ddpwatch-soak-")
    env = C.child_env(
        DDPWATCH_DIR=report_dir,
        DDPWATCH_TIMEOUT=str(TIMEOUT_S),
        DDPWATCH_GRACE="0.5",
        DDPWATCH_INTERVAL="0.2",
        DDPWATCH_ACTION="report",
    )
    started = time.monotonic()
    results = run_ranks(
        [sys.executable, "-m", "benchmarks.soak", "--worker", "--minutes", str(minutes)],
        2,
        env=env,
        timeout=minutes * 60 + 180,
        cwd=C.ROOT,
    )
    elapsed = (time.monotonic() - started) / 60
    reports = glob.glob(os.path.join(report_dir, "*", "report.json"))
    lines = [line for r in results for line in r.stdout.splitlines() if line.startswith(C.RESULT_TAG)]
    parsed = [_fields(line) for line in lines]
    fields = parsed[0] if parsed else {}
    longest = max((float(f.get("longest_wait", 0.0)) for f in parsed), default=0.0)  # any rank's
    past = sum(int(f.get("past_timeout", 0)) for f in parsed)  # the waits that called for a report
    due = [path for path in reports if _is_straggler(path)][:past]
    false_alarms = [path for path in reports if path not in due]
    C.print_table(
        "Soak: benign uneven work (rank 0 busy 90% of the timeout each epoch), grace 0.5 s",
        ["minutes", "epochs", "collectives per rank", "longest wait (s)", "exit codes", "false alarms", "reports due"],
        [
            [
                f"{elapsed:.1f}",
                fields.get("epochs", "?"),
                fields.get("ops", "?"),
                f"{longest:.2f}",
                ",".join(str(r.returncode) for r in results),
                len(false_alarms),
                len(due),
            ]
        ],
    )
    if due:  # the machine was slower than the margin: a rank did wait past the timeout, and that was reported
        print(f"{len(due)} wait(s) measured past the {TIMEOUT_S:g} s timeout (longest {longest:.2f} s): reports due")
    if reports:
        print(f"the reports are kept in {report_dir}")
    else:
        shutil.rmtree(report_dir, ignore_errors=True)
    ok = all(r.returncode == 0 for r in results) and lines and not false_alarms
    return 0 if ok else 1


def _fields(line: str) -> dict:
    """A worker's result line, `<tag>rank=0 epochs=3 ...`, as {name: text}."""
    return dict(part.split("=", 1) for part in line[len(C.RESULT_TAG) :].split())


def _is_straggler(path: str) -> bool:
    """Whether a report is the straggler reading that a wait measured past the timeout calls for (rank 0 busy 90% of
    it leaves 0.5 s, which a loaded machine can use up): one such report per such wait is due, and nothing else."""
    import json

    with open(path) as handle:
        report = json.load(handle)
    kinds = {finding.get("kind") for finding in report.get("findings") or ()}
    return report.get("trigger") == "timeout" and kinds == {"straggler"}


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
