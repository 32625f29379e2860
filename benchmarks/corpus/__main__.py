"""`python -m benchmarks.corpus [--only NAME ...] [--json PATH] [--limit S]`: run every case under ddpwatch, score."""

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


def run_case(path: str, limit: float) -> dict:
    """Run one case as world_size gloo ranks with ddpwatch on (zero-code, action=abort) and score what it wrote."""
    expect = score.load_expect(path)
    folder = tempfile.mkdtemp(prefix=f"ddpwatch-corpus-{score.case_name(path)}-")
    env = dict(os.environ, DDPWATCH="1", DDPWATCH_ACTION="abort", DDPWATCH_DIR=folder, PYTHONPATH=ROOT)
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
    row = score.score(expect, path, report, [r.returncode for r in results], score.last_mark(r.stderr for r in results))
    row["wall_s"] = round(wall, 1)
    shutil.rmtree(folder, ignore_errors=True)
    return row


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
    opts = parser.parse_args(argv)
    paths = score.case_paths(opts.only)
    if not paths:
        parser.error(f"no case matches {opts.only}")
    print(
        f"== ddpwatch corpus: {len(paths)} cases, limit {opts.limit:.0f} s each, ddpwatch at {commit()}, "
        f"torch on Python {platform.python_version()} ==",
        flush=True,
    )
    rows = []
    for path in paths:
        row = run_case(path, opts.limit)
        rows.append(row)
        got = row["said"]["kind"] if row["said"] else "no report"
        print(f"  {row['case']}: {got} (exit {row['exit_codes']}, {row['wall_s']} s)", file=sys.stderr, flush=True)
    print()
    print(score.table(rows))
    wrong = score.misses(rows)
    if wrong:
        print("\nWhat ddpwatch said instead:")
        print("\n".join(f"  {line}" for line in wrong))
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"commit": commit(), "limit_s": opts.limit, "created": time.time(), "rows": rows}, handle, indent=1
            )
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
