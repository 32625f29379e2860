"""`ddpwatch dump`, the shell side: find an armed local rank in the registry, signal it, print its new report folder."""

from __future__ import annotations

import os
import signal
import sys
import time

from .registry import is_current, job_key, rank_of, registry, registry_dir, signal_rank
from .terminal import visible


def _report_folders(base: str) -> set:
    try:
        return {
            entry.path
            for entry in os.scandir(base)
            if not entry.name.startswith(".")  # .incoming-*: staging
            and entry.is_dir()
            and os.path.isfile(os.path.join(entry.path, "report.json"))
        }
    except OSError:
        return set()


def describe(entry: dict) -> str:
    program = f" ({entry['program']})" if entry.get("program") else ""
    return visible(
        f"pid {entry.get('pid')}{program}: rank {entry.get('rank')} of {entry.get('world_size')}, "
        f"job {job_key(entry)}, reports to {entry.get('dir')}"
    )


def _entries_or_say_why(folder: str | None, err) -> list | None:
    try:
        return registry(folder)
    except OSError as exc:
        err.write(f"ddpwatch dump: {exc}\n")
        return None


def dump(
    pid: int | None = None,
    job: str | None = None,
    report_dir: str | None = None,
    wait: float = 30.0,
    out=None,
    err=None,
    folder: str | None = None,
) -> int:
    """Signal one armed rank (the lowest of the one local job, or `pid`) and print the new report folder's path.

    0: printed; 1: no rank, or no report within `wait` seconds; 2: several jobs and nothing to choose between them.
    """
    out, err = out or sys.stdout, err or sys.stderr
    entries = _entries_or_say_why(folder, err)
    if entries is None:
        return 1
    if pid is not None:
        matching = [entry for entry in entries if entry.get("pid") == pid]
        if not matching:
            err.write(
                f"ddpwatch dump: pid {pid} is not an armed ddpwatch rank on this host "
                f"(`ddpwatch dump --list` shows those that are)\n"
            )
            return 1
        target = matching[0]
    else:
        if job:
            entries = [entry for entry in entries if job in (entry.get("job"), entry.get("master"), job_key(entry))]
        jobs = sorted({job_key(entry) for entry in entries})
        if not jobs:
            err.write(
                "ddpwatch dump: no armed ddpwatch rank on this host"
                + (f" in job {job}" if job else "")
                + f" (registry: {folder or registry_dir()})\n"
            )
            return 1
        if len(jobs) > 1:
            err.write(
                "ddpwatch dump: ranks of several jobs run here; choose one with --job or --pid:\n"
                + "".join(f"  {describe(entry)}\n" for entry in entries)
            )
            return 2
        target = min(entries, key=rank_of)
    base = report_dir or target.get("dir") or "."
    before = _report_folders(base)
    try:
        if not signal_rank(target, signal.SIGUSR1):
            err.write(f"ddpwatch dump: pid {target['pid']} is no longer the rank that registered; not signalled\n")
            return 1
    except OSError as exc:
        err.write(f"ddpwatch dump: cannot signal pid {target['pid']}: {exc}\n")
        return 1
    err.write(f"ddpwatch dump: asked {describe(target)}\n")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        new = sorted(_report_folders(base) - before)
        if new:
            out.write(visible(new[-1]) + "\n")  # whoever can write a shared report folder names its entries
            return 0
        if not is_current(target):
            err.write(f"ddpwatch dump: pid {target['pid']} exited before writing a report\n")
            return 1
        time.sleep(0.1)
    err.write(f"ddpwatch dump: no new report under {base} after {wait:g} s\n")
    return 1


def list_ranks(out=None, folder: str | None = None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    entries = _entries_or_say_why(folder, err) or []
    for entry in entries:
        out.write(describe(entry) + "\n")
    return 0 if entries else 1
