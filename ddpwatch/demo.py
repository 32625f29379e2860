"""`ddpwatch demo`: runs the seed stall on 2 local CPU ranks (gloo), lets it hang, and shows ddpwatch catching it."""

from __future__ import annotations

import glob
import os
import sys
import time

from . import private
from .launch import run_ranks

DEMO_TIMEOUT_S = 180.0
NO_NUMPY_WARNING = "ignore:Failed to initialize NumPy:UserWarning"


def demo_report_dir(explicit: str | None, settings) -> str | None:
    """Where the demo's reports go: --dir, else the configured dir (DDPWATCH_DIR, setup.cfg, pyproject.toml), else
    None: run_demo's own default, this user's private folder in the temp dir (not ./ddpwatch-reports: a demo should
    not litter the cwd)."""
    if explicit:
        return os.path.abspath(explicit)
    if settings.sources.get("dir", "default") != "default":
        return os.path.abspath(os.path.expanduser(settings.dir))
    return None


def run_demo(fixed: bool = False, report_dir: str | None = None, nprocs: int = 2) -> int:
    """0 when the demo did what it shows (stall caught, or the fixed loop finished clean), 1 otherwise; 2 when the
    default report folder (this user's private folder in the temp dir) cannot be trusted."""
    if report_dir is None:
        try:
            report_dir = private.private_path("demo")  # not a fixed name in /tmp: others could prepare it
        except OSError as exc:
            print(f"ddpwatch demo: {exc}", file=sys.stderr)
            return 2
    report_dir = os.path.abspath(report_dir)
    before = set(glob.glob(os.path.join(report_dir, "*", "report.json")))
    env = dict(os.environ, DDPWATCH_DIR=report_dir, DDPWATCH_ACTION="abort")
    env.pop("DDPWATCH", None)  # the script guards itself; keep zero-code activation from doubling up
    # numpy is not a dependency: without it, torch warns at import that it could not initialise NumPy, twice, in
    # words a newcomer takes for a broken install. The demo never touches numpy; a user's own filters stay first.
    env["PYTHONWARNINGS"] = ",".join(p for p in (env.get("PYTHONWARNINGS"), NO_NUMPY_WARNING) if p)
    # The stall leaves validation's progress bar at 0% above the report, as if it were still coming; tqdm (4.66+)
    # shows none for a loop that ends within this delay, while ddpwatch still reads the bar into the report.
    env.setdefault("TQDM_DELAY", "5")
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "ddpwatch.examples.seed_stall"] + (["--fixed"] if fixed else [])
    what = (
        "the fixed loop (model.module(x) in validation)"
        if fixed
        else "the seed stall (DDP wrapper in rank-0 validation)"
    )
    print(f"ddpwatch demo: {nprocs} CPU ranks on gloo run {what}; reports go to {report_dir}", file=sys.stderr)
    started = time.monotonic()
    results = run_ranks(command, nprocs, env=env, timeout=DEMO_TIMEOUT_S, capture=False)
    elapsed = time.monotonic() - started
    new = sorted(set(glob.glob(os.path.join(report_dir, "*", "report.json"))) - before)
    codes = [r.returncode for r in results]
    if fixed:
        ok = all(code == 0 for code in codes) and not new
        print(
            f"ddpwatch demo: the fixed loop {'finished cleanly with no report' if ok else 'did NOT finish cleanly'}"
            f" in {elapsed:.1f} s (exit codes {codes})",
            file=sys.stderr,
        )
        return 0 if ok else 1
    if new:
        print(
            f"ddpwatch demo: stall caught; every rank ended (exit codes {codes}) after {elapsed:.1f} s.\n"
            f"ddpwatch demo: report folder: {os.path.dirname(new[-1])}",
            file=sys.stderr,
        )
        return 0
    print(f"ddpwatch demo: no report was written (exit codes {codes}); the stall was NOT caught", file=sys.stderr)
    return 1
