"""`python -m benchmarks.corpus [--only NAME] [--family F] [--recorder R] [--json PATH]`: run the cases, score."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from ddpwatch.launch import run_ranks

from . import score

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_case(
    path: str, limit: float, recorder: str | None = None, plain: list | None = None, timeout=None, interval=None
) -> dict:
    """Run one case as world_size gloo ranks with ddpwatch on (zero-code, action=abort) and score what it wrote.
    `recorder`: DDPWATCH_RECORDER (None: the default); `plain`: each rank's stdout without ddpwatch, which a correct
    program must print the same armed; `timeout`: DDPWATCH_TIMEOUT (a short one makes a benign wait count);
    `interval`: DDPWATCH_INTERVAL (a short one compares the ranks' positions more often: more chances to cry wolf)."""
    expect = score.load_expect(path)
    folder = tempfile.mkdtemp(prefix=f"ddpwatch-corpus-{score.case_name(path)}-")
    env = dict(os.environ, DDPWATCH="1", DDPWATCH_ACTION="abort", DDPWATCH_DIR=folder, PYTHONPATH=ROOT)
    if recorder:
        env["DDPWATCH_RECORDER"] = recorder
    if timeout:
        env["DDPWATCH_TIMEOUT"] = str(timeout)
    if interval:
        env["DDPWATCH_INTERVAL"] = str(interval)
    start = time.monotonic()
    # Once report.json exists the score has what it needs; abort normally ends the ranks before this fires.
    results = run_ranks(
        [sys.executable, path],
        expect["world_size"],
        env=env,
        timeout=limit,
        cwd=ROOT,
        stop_when=lambda: score.read_report(folder) is not None,
    )
    report = score.read_report(folder)
    wall = time.monotonic() - start
    differs = plain is not None and [r.stdout for r in results] != plain
    row = score.score(
        expect,
        path,
        report,
        [r.returncode for r in results],
        score.last_mark(r.stderr for r in results),
        output_differs=differs,
    )
    row["wall_s"] = round(wall, 1)
    row["recorder"] = recorder or "default"
    if row["false_alarm"]:  # what a person needs to see why: each rank's last words
        row["stderr_tails"] = [r.stderr[-1500:] for r in results]
    shutil.rmtree(folder, ignore_errors=True)
    return row


def run_plain(path: str, limit: float) -> tuple:
    """(each rank's stdout, exit codes) of a case without ddpwatch: what a correct program prints, unguarded."""
    expect = score.load_expect(path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPWATCH")}
    results = run_ranks([sys.executable, path], expect["world_size"], env=dict(env, PYTHONPATH=ROOT), timeout=limit)
    return [r.stdout for r in results], [r.returncode for r in results]


def commit() -> str:
    try:
        return (
            subprocess.run(
                ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only cases whose file name contains NAME")
    parser.add_argument("--json", metavar="PATH", help="also write every row (and what ddpwatch said) as JSON")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds a case may run before it is killed")
    parser.add_argument("--family", choices=sorted(score.FAMILIES), help="run only the cases of this family")
    parser.add_argument(
        "--recorder",
        nargs="+",
        metavar="R",
        help="DDPWATCH_RECORDER values to run each case under (default: the default recorder; for --family benign: "
        "python and flight, every recorder that ships)",
    )
    parser.add_argument(
        "--timeout", type=float, help="DDPWATCH_TIMEOUT for every run (default: ddpwatch's; benign: 5 s)"
    )
    parser.add_argument("--interval", type=float, help="DDPWATCH_INTERVAL for every run (default: ddpwatch's, 1 s)")
    opts = parser.parse_args(argv)
    paths = score.case_paths(opts.only)
    if opts.family:
        paths = [p for p in paths if score.load_expect(p)["family"] == opts.family]
    if not paths:
        parser.error(f"no case matches {opts.only or ''} {opts.family or ''}")
    benign_only = opts.family == "benign"
    recorders = opts.recorder or (["python", "flight"] if benign_only else [None])
    timeout = opts.timeout or (5.0 if benign_only else None)
    print(
        f"== ddpwatch corpus: {len(paths)} cases x {len(recorders)} recorder(s), limit {opts.limit:.0f} s each, "
        f"ddpwatch at {commit()}, torch on Python {platform.python_version()} ==",
        flush=True,
    )
    rows = []
    for path in paths:
        plain = None
        if score.load_expect(path)["family"] == "benign":
            plain, codes = run_plain(path, opts.limit)
            print(f"  {score.case_name(path)}: plain exit {codes}", file=sys.stderr, flush=True)
        for recorder in recorders:
            row = run_case(path, opts.limit, recorder, plain, timeout, opts.interval)
            rows.append(row)
            got = row["said"]["kind"] if row["said"] else "no report"
            print(
                f"  {row['case']} [{row['recorder']}]: {got} (exit {row['exit_codes']}, {row['wall_s']} s"
                + (", printed other results than plain" if row.get("output_differs") else "")
                + ")",
                file=sys.stderr,
                flush=True,
            )
    print()
    for recorder in recorders:
        label = recorder or "default"
        if len(recorders) > 1:
            print(f"-- recorder {label} --")
        print(score.table([r for r in rows if r["recorder"] == label]))
        print()
    wrong = score.misses(rows)
    if wrong:
        print("\nWhat ddpwatch said instead:")
        print("\n".join(f"  {line}" for line in wrong))
    alarms = [r for r in rows if r.get("false_alarm") and r["scored"]]  # a gloo-only thread is shown, not scored
    for row in alarms:
        said = row["said"]["kind"] if row["said"] else "no report"
        print(f"\nFALSE ALARM {row['case']} [{row['recorder']}]: {said}, exit {row['exit_codes']}", file=sys.stderr)
        for tail in row.get("stderr_tails") or ():
            print("    " + tail.replace("\n", "\n    ")[-1200:], file=sys.stderr)
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"commit": commit(), "limit_s": opts.limit, "created": time.time(), "rows": rows}, handle, indent=1
            )
            handle.write("\n")
    return 1 if benign_only and alarms else 0


if __name__ == "__main__":
    sys.exit(main())
