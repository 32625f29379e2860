"""The whole job, armed vs plain: torchrun jobs run as whole processes, with and without DDPWATCH=1 (issue 30).

Each run is `python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/whole_job_train.py JOB
STEPS` in a fresh temporary folder (no settings file there), with DDPWATCH=1 in its environment (armed) or not
(plain). Measured per run: the training loop's wall time (the job reports it: barrier to barrier, the slower rank),
the whole job's CPU time, launcher included (os.wait4 on torchrun: its own and its reaped ranks' user + system
time), the whole job's wall time (start to exit), and the training loop's CPU time by thread, both ranks summed
(each rank reads /proc/self/task: its training thread, ddpwatch's threads, the backend's threads; 10 ms ticks; no
ratio for ddpwatch's threads, which a plain run has none of). Pairs of runs go A B, B A, A B, ... (ABBA), jobs
interleaved within each pair; per job and measure the table gives the median ratio armed / plain over the pairs, the
spread (min .. max) and every pair's ratio.

Attribution (--attribute, the ddp job by default): the runs of each pair of an attributed job go through ddpwatch's
parts one level at a time (benchmarks/whole_job_parts.py: plain, start-up, wrappers, DDP/FSDP regions, watchdog,
store traffic, in palindrome order across pairs), the plain and armed runs being the pair's own. A row is the step
between the medians over pairs of (level - plain) of the same pair: the rows add up to the median difference armed -
plain of the main table, exactly; the spread of each step over the pairs says how far to trust it.

python -m benchmarks.whole_job [--quick] [--jobs ddp fsdp2 many] [--pairs 5] [--steps N | JOB=N ...]
                               [--attribute JOB ...] [--neighbour] [--json PATH]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from ddpwatch.launch import kill_tree

from . import _common as C
from .whole_job_parts import LEVELS, PLAIN, ROWS, SHIPPED, WATCHDOG, WRAPPERS

TRAIN = os.path.join(C.ROOT, "benchmarks", "whole_job_train.py")
JOBS = ("ddp", "fsdp2", "many")
# Micro-steps per rank, sized for a plain run of 15-20 s on the 2-core machine of docs/performance.md, 4-6 s of it
# torchrun and three interpreters importing torch. Sized on a loaded machine (load average 6-7: 43-45 ms per step
# of each job, 6 s of start-up), so an estimate for a quiet one: the benchmark prints each run's times.
STEPS = {"ddp": 400, "fsdp2": 400, "many": 500}
QUICK_STEPS = {"ddp": 12, "fsdp2": 6, "many": 4}
MEASURES = {
    "loop_wall_s": "training-loop wall (s)",
    "job_cpu_s": "whole-job CPU, launcher included (s)",
    "total_wall_s": "whole-job wall (s)",
    # The training loop's CPU by thread, both ranks: where an armed run's extra CPU is spent (per rank, /proc).
    "loop_training_cpu_s": "loop CPU, training threads (s)",
    "loop_ddpwatch_cpu_s": "loop CPU, ddpwatch's threads (s)",
    "loop_backend_cpu_s": "loop CPU, the backend's threads (s)",
}
THREAD_KINDS = ("training", "ddpwatch", "backend")  # whole_job_train.threads_cpu()
NEIGHBOUR = "while True: pass"  # one core kept busy by a pure-Python loop, for as long as the measurement runs
FORMAT = 2  # the JSON document's version: 1, the first; 2 adds the loop CPU by thread


def launch(job: str, steps: int, level: int, limit: float) -> dict:
    """One whole job at one level (PLAIN: no DDPWATCH; SHIPPED: DDPWATCH=1 as it is); killed, group and all, at the
    limit. The measures, or an "error"."""
    with tempfile.TemporaryDirectory(prefix="ddpwatch-wholejob-") as out:
        env = C.child_env(BENCH_WHOLEJOB_OUT=out)
        env.pop("BENCH_WHOLEJOB_LEVEL", None)
        if level != PLAIN:
            env["DDPWATCH"] = "1"
        if PLAIN < level < SHIPPED:
            env["BENCH_WHOLEJOB_LEVEL"] = str(level)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            TRAIN,
            job,
            str(steps),
        ]
        with open(os.path.join(out, "output.txt"), "w+") as output:
            status, usage, wall = _run_and_reap(command, env, out, output, limit)
            output.seek(0)
            text = output.read()
        ranks = [_read_json(os.path.join(out, f"rank{rank}.json")) for rank in range(2)]
    run = {"job": job, "steps": steps, "level": level, "total_wall_s": wall}
    if status is None or status != 0 or None in ranks:
        how = "killed at the time limit" if status is None else f"exit {status}"
        return dict(run, error=f"{how}; last output: {text[-1500:]}", ranks_reported=len([r for r in ranks if r]))
    by_thread = [r.get("loop_cpu_by_thread_s") for r in ranks]
    threads = {} if None in by_thread else {f"loop_{k}_cpu_s": sum(b[k] for b in by_thread) for k in THREAD_KINDS}
    return dict(
        run,
        loop_wall_s=max(r["loop_wall_s"] for r in ranks),
        job_cpu_s=usage,
        ranks_cpu_s=sum(r["process_cpu_s"] for r in ranks),
        ddpwatch=[r["ddpwatch"] for r in ranks],
        **threads,
    )


def _run_and_reap(command: list, env: dict, cwd: str, output, limit: float) -> tuple:
    """(exit code or None if killed, CPU seconds of the process and its reaped descendants, wall seconds)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    reaped: dict = {}

    def reap() -> None:  # wait4, not Popen.wait: the rusage of torchrun and every rank it reaped
        _, status, usage = os.wait4(proc.pid, 0)
        reaped.update(end=time.perf_counter(), status=status, cpu=usage.ru_utime + usage.ru_stime)

    waiter = threading.Thread(target=reap, daemon=True)
    waiter.start()
    killed = True
    try:
        waiter.join(limit)
        killed = waiter.is_alive()
    finally:  # at the limit or on SIGTERM: the job's tree; after a normal exit, whatever it left in its group
        kill_tree(proc.pid)
        # Not waiter.join(): after a signal handler raised out of a join, join() may return at once (CPython).
        deadline = time.monotonic() + 30
        while "status" not in reaped and time.monotonic() < deadline:
            time.sleep(0.01)
        if "status" in reaped:  # reaped by wait4: Popen must not wait for it again
            proc.returncode = os.waitstatus_to_exitcode(reaped["status"])
    return None if killed else proc.returncode, reaped["cpu"], reaped["end"] - start


def _read_json(path: str):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def label_problem(run: dict) -> str:
    """'' when the run had on what its level says (the worktree's ddpwatch, the watchdog where it should be)."""
    facts = run.get("ddpwatch") or []
    if run["level"] == PLAIN:
        return "" if not any(facts) else "ddpwatch was armed in a plain run"
    if not all(facts):
        return "ddpwatch was not armed in every rank"
    if any(f["file"] != C.ROOT for f in facts):
        return f"the ranks ran ddpwatch from {facts[0]['file']}, not {C.ROOT}"
    if any(f["watchdog"] != (run["level"] >= WATCHDOG) for f in facts):
        return "a watchdog where the level has none, or none where it has one"
    if any((f["patches"] > 0) != (run["level"] >= WRAPPERS) for f in facts):
        return "patches where the level has none, or none where it has some"
    return ""


def schedule(jobs: list, pairs: int, attributed: list) -> list:
    """(pair, job, level) in run order: each pair of a job is plain then armed, or armed then plain (ABBA across
    pairs), with an attributed job's levels between them; jobs take turns within each pair."""
    order = []
    for pair in range(pairs):
        for job in jobs:
            levels = list(range(len(LEVELS))) if job in attributed else [PLAIN, SHIPPED]
            order += [(pair, job, level) for level in (levels if pair % 2 == 0 else levels[::-1])]
    return order


def measure(jobs: list, pairs: int, steps: dict, attributed: list, limit: float, warm_up: bool) -> list:
    if warm_up:  # the first runs read torch and ddpwatch from disk: not part of any pair
        for job in jobs:
            launch(job, QUICK_STEPS[job], SHIPPED, limit)
    runs = []
    order = schedule(jobs, pairs, attributed)
    for index, (pair, job, level) in enumerate(order):
        # A run no rank reported from is a failed run, its pair a failed pair, and the command exits 1: never launched
        # again (issue 43: a relaunch hid a failure, armed runs included, and the figures still stood)
        run = dict(launch(job, steps[job], level, limit), pair=pair)
        run["problem"] = run.get("error") or label_problem(run)
        runs.append(run)
        shown = (
            f"loop {run['loop_wall_s']:.2f} s, job CPU {run['job_cpu_s']:.2f} s, wall {run['total_wall_s']:.2f} s"
            if "loop_wall_s" in run
            else ""
        )
        print(
            f"[{index + 1}/{len(order)}] pair {pair + 1} {job} {label(level)}: {shown} {run['problem']}".rstrip(),
            flush=True,
        )
    return runs


def label(level: int) -> str:
    return {PLAIN: "plain", SHIPPED: "armed"}.get(level, f"armed up to {LEVELS[level]}")


def by_pair(runs: list, job: str, level: int, measure_name: str) -> dict:
    """pair -> the measure, for the runs of this job and level that went as labelled and have it (the loop's CPU by
    thread needs /proc)."""
    return {
        r["pair"]: r[measure_name]
        for r in runs
        if r["job"] == job and r["level"] == level and not r["problem"] and measure_name in r
    }


def summary(runs: list, job: str) -> dict:
    """Per measure: medians plain and armed, the median difference and ratio over pairs, the ratios' spread."""
    stats = {}
    for name in MEASURES:
        plain, armed = by_pair(runs, job, PLAIN, name), by_pair(runs, job, SHIPPED, name)
        pairs = sorted(set(plain) & set(armed))
        if not pairs:
            stats[name] = None
            continue
        # No ratio where a plain run has none of it (ddpwatch's threads): the added seconds say it.
        ratios = [armed[p] / plain[p] for p in pairs] if all(plain[p] > 0 for p in pairs) else None
        stats[name] = {
            "plain": statistics.median(plain[p] for p in pairs),
            "armed": statistics.median(armed[p] for p in pairs),
            "added": statistics.median(armed[p] - plain[p] for p in pairs),
            "ratio": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "ratios": ratios,
            "pairs": len(pairs),
        }
    return stats


def attribution(runs: list, job: str) -> dict:
    """Per measure, per level above plain: the step from the level below (median over pairs of level - plain,
    less the same for the level below), its share of the total and the spread of the step pair by pair."""
    result = {}
    for name in MEASURES:
        values = [by_pair(runs, job, level, name) for level in range(len(LEVELS))]
        pairs = sorted(set.intersection(*(set(v) for v in values)))
        if not pairs:
            result[name] = None
            continue
        cumulative = [
            statistics.median(values[level][p] - values[PLAIN][p] for p in pairs) for level in range(len(LEVELS))
        ]
        total = cumulative[SHIPPED]
        rows = {}
        for level in range(PLAIN + 1, len(LEVELS)):
            steps = [values[level][p] - values[level - 1][p] for p in pairs]
            added = cumulative[level] - cumulative[level - 1]
            rows[LEVELS[level]] = {
                "added": added,
                "share": added / total if total else None,
                "step_min": min(steps),
                "step_max": max(steps),
            }
        result[name] = {"total": total, "pairs": len(pairs), "rows": rows}
    return result


def print_summary(summaries: dict) -> None:
    rows = []
    for job, stats in summaries.items():
        for name, title in MEASURES.items():
            s = stats[name]
            if s is None:
                rows.append([job, title, None, None, None, "no complete pair", None, None])
                continue
            rows.append(
                [
                    job,
                    title,
                    s["plain"],
                    s["armed"],
                    f"{s['added']:+.3f}",
                    f"{s['ratio']:.4f}" if s["ratios"] else "-",
                    f"{s['ratio_min']:.4f} .. {s['ratio_max']:.4f}" if s["ratios"] else "-",
                    " ".join(f"{r:.3f}" for r in s["ratios"]) if s["ratios"] else "- (none in a plain run)",
                ]
            )
    C.print_table(
        "Whole jobs, armed (DDPWATCH=1) vs plain: medians over the pairs; the ratio is armed / plain within a pair",
        [
            "job",
            "measure",
            "plain (median)",
            "armed (median)",
            "added (median of pairs)",
            "ratio (median)",
            "ratio min .. max",
            "ratio per pair",
        ],
        rows,
    )


def print_attribution(job: str, result: dict) -> None:
    rows = []
    for level in range(PLAIN + 1, len(LEVELS)):
        row = [ROWS[level]]
        for name in MEASURES:
            r = result[name] and result[name]["rows"][LEVELS[level]]
            row += (
                [None, None]
                if not r
                else [
                    f"{r['added']:+.3f}" + (f" ({r['share'] * 100:.0f}%)" if r["share"] is not None else ""),
                    f"{r['step_min']:+.2f} .. {r['step_max']:+.2f}",
                ]
            )
        rows.append(row)
    totals = [(f"{result[name]['total']:+.3f}", "") if result[name] else (None, None) for name in MEASURES]
    rows.append(["total: armed - plain (the main table's added)"] + [cell for pair in totals for cell in pair])
    columns = ["part (each level adds it to the one above)"]
    for title in MEASURES.values():
        columns += [f"{title}: added", "step min .. max"]
    pairs = max((r["pairs"] for r in result.values() if r), default=0)
    C.print_table(
        f"Where the difference comes from, {job} job ({pairs} pairs; benchmarks/whole_job_parts.py): "
        f"steps between the medians over pairs of (level - plain), which add up to the total",
        columns,
        rows,
    )


def parse_steps(items: list, jobs: list, quick: bool) -> dict:
    steps = dict(QUICK_STEPS if quick else STEPS)
    for item in items or []:
        job, _, count = item.rpartition("=")
        for name in [job] if job else jobs:
            if name not in JOBS:
                raise SystemExit(f"--steps: no job {name!r} (jobs: {', '.join(JOBS)})")
            steps[name] = int(count)
    return steps


def start_neighbour():
    return subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdin=subprocess.DEVNULL, start_new_session=True)


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS), help="which jobs (default: all)")
    args.add_argument("--pairs", type=int, help="ABBA pairs of runs per job (default 5; --quick: 1)")
    args.add_argument(
        "--steps",
        nargs="+",
        metavar="N|JOB=N",
        help=f"micro-steps per rank, for every job or one (default {STEPS}; --quick: {QUICK_STEPS})",
    )
    args.add_argument(
        "--attribute",
        nargs="*",
        choices=JOBS,
        default=["ddp"],
        help="jobs whose difference is attributed part by part (default: ddp; none: --attribute)",
    )
    args.add_argument("--neighbour", action="store_true", help="a CPU-bound process beside the jobs throughout")
    args.add_argument("--run-limit", type=float, help="seconds one job may run (default 600; --quick: 120)")
    args.add_argument("--json", metavar="PATH", help="write every run and the summaries here")
    opts = args.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # so the job running is killed too
    pairs = opts.pairs or (1 if opts.quick else 5)
    steps = parse_steps(opts.steps, opts.jobs, opts.quick)
    attributed = [job for job in opts.attribute if job in opts.jobs]
    limit = opts.run_limit or (120.0 if opts.quick else 600.0)
    C.header("whole_job: whole torchrun jobs, armed vs plain", opts.quick)
    print(
        f"jobs {', '.join(opts.jobs)}; micro-steps per rank {', '.join(f'{j} {steps[j]}' for j in opts.jobs)}; "
        f"{pairs} pairs; attributed: {', '.join(attributed) or 'none'}; "
        f"{'beside a CPU-bound neighbour (' + NEIGHBOUR + ')' if opts.neighbour else 'no neighbour'}",
        flush=True,
    )
    started, neighbour = time.perf_counter(), start_neighbour() if opts.neighbour else None
    try:
        runs = measure(opts.jobs, pairs, steps, attributed, limit, warm_up=not opts.quick)
    finally:
        if neighbour is not None:
            kill_tree(neighbour.pid)
            neighbour.wait()
    summaries = {job: summary(runs, job) for job in opts.jobs}
    attributions = {job: attribution(runs, job) for job in attributed}
    print_summary(summaries)
    for job, result in attributions.items():
        print_attribution(job, result)
    problems = [f"pair {r['pair'] + 1} {r['job']} {label(r['level'])}: {r['problem']}" for r in runs if r["problem"]]
    print(
        f"{len(runs)} runs in {time.perf_counter() - started:.0f} s; load average at the end: "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}; runs that failed or were not what their label says: "
        f"{len(problems)}" + "".join(f"\n  {p[:300]}" for p in problems)
    )
    if opts.json:
        with open(opts.json, "w") as handle:
            json.dump(
                {
                    "format": FORMAT,
                    "machine": C.machine(),
                    "ddpwatch": C.code_version(),
                    "quick": opts.quick,
                    "neighbour": opts.neighbour,
                    "pairs": pairs,
                    "steps": {j: steps[j] for j in opts.jobs},
                    "levels": list(LEVELS),
                    "measures": MEASURES,
                    "summary": summaries,
                    "attribution": attributions,
                    "runs": runs,
                },
                handle,
                indent=1,
            )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
