"""Helpers shared by the benchmarks: arguments, bounded child processes, A/B/B/A statistics and table printing."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_TAG = "BENCH-RESULT "


def parser(description: str) -> argparse.ArgumentParser:
    """Every benchmark takes --quick (the CI mode: small sizes, same code path)."""
    args = argparse.ArgumentParser(description=description)
    args.add_argument("--quick", action="store_true", help="small sizes for CI; numbers are indicative only")
    return args


def machine() -> str:
    """One line naming what the numbers were measured on."""
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        import torch

        version = torch.__version__
    except ImportError:
        version = "not installed"
    return (
        f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, torch {version}, "
        f"{platform.system()} {platform.release()}"
    )


def code_version() -> str:
    """The ddpwatch measured: the commit, and whether ddpwatch/ had uncommitted changes (read-only git calls)."""
    try:
        sha = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", ROOT, "status", "--porcelain", "--", "ddpwatch"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (sha or "unknown") + (" with uncommitted changes in ddpwatch/" if dirty else "")


def header(name: str, quick: bool) -> None:
    print(f"== {name} ({'quick' if quick else 'full'} mode) ==")
    print(f"machine: {machine()}")
    # Other processes on a shared machine move every wall-time figure: say how busy it was.
    print(f"ddpwatch: {code_version()}; load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    sys.stdout.flush()


def print_table(title: str, columns: list, rows: list) -> None:
    """A Markdown table, so a run's output can go into docs/performance.md as it is."""
    cells = [[str(c) for c in columns]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    line = lambda row: "| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |"
    print(f"\n{title}\n")
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print(line(row))
    print()
    sys.stdout.flush()


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return "-" if value is None else str(value)


def child_env(**overrides) -> dict:
    """This environment, with the repository importable and no zero-code activation leaking in."""
    env = dict(os.environ)
    env.pop("DDPWATCH", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update({key: str(value) for key, value in overrides.items()})
    return env


def run_bounded(command: list, timeout: float, env: dict | None = None, capture: bool = True):
    """Run a child in its own process group; at the limit the whole group is killed. Returns (rc, stdout, stderr)."""
    proc = subprocess.Popen(
        command,
        env=env or child_env(),
        cwd=ROOT,
        start_new_session=True,
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out or "", err or ""
    except subprocess.TimeoutExpired:
        _killpg(proc.pid)
        out, err = proc.communicate()
        return None, out or "", (err or "") + f"\n[killed after {timeout:.0f} s]"
    finally:
        _killpg(proc.pid)  # grandchildren too, whatever happened above
        if proc.poll() is None:
            proc.wait()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def emit(doc: dict) -> None:
    """A rank's results, one JSON line on stdout, for the parent to parse."""
    print(RESULT_TAG + json.dumps(doc), flush=True)


def parse_results(text: str) -> list:
    return [json.loads(line[len(RESULT_TAG) :]) for line in text.splitlines() if line.startswith(RESULT_TAG)]


def thread_cpu(thread) -> float:
    """CPU seconds another thread has used so far, from its own CPU clock (pthread_getcpuclockid); 0.0 without one.

    time.thread_time() inside the thread is out of reach (the watchdog's loop is ddpwatch's); this reads it from
    outside at any moment."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError, TypeError, ValueError):
        return 0.0


def abba(rounds: int) -> list:
    """The condition order: A B B A per round, so a slow drift of the machine hits both sides equally."""
    return [flag for _ in range(rounds) for flag in (False, True, True, False)]


def paired(times_off: list, times_on: list, per_round: int = 2) -> dict:
    """Per-round means of each condition -> median added cost, its spread across rounds, and the median ratio.

    `best_added` is the fastest block with minus the fastest block without: on a shared machine every disturbance
    only adds time, so the minimum is the estimate of a CPU-bound cost least moved by others (timeit's advice).
    """
    rounds = len(times_off) // per_round
    offs = [statistics.fmean(times_off[i * per_round : (i + 1) * per_round]) for i in range(rounds)]
    ons = [statistics.fmean(times_on[i * per_round : (i + 1) * per_round]) for i in range(rounds)]
    diffs = [on - off for on, off in zip(ons, offs)]
    ratios = [on / off for on, off in zip(ons, offs) if off > 0]
    return {
        "off": statistics.median(offs),
        "on": statistics.median(ons),
        "added": statistics.median(diffs),
        "added_min": min(diffs),
        "added_max": max(diffs),
        "ratio": statistics.median(ratios),
        "best_added": min(times_on) - min(times_off),
        "rounds": rounds,
        "ratios": ratios,
    }


def ratio_verdict(ratios: list, target: float = 1.01) -> str:
    """ "met", "NOT met" or "undecided" for a ratio target, judged on the mean of per-round ratios and its standard
    error: a verdict needs the spread (the standard error) below the margin the target allows (1% for 1.01)."""
    if len(ratios) < 2:
        return f"undecided (one round; mean ratio {ratios[0]:.3f})" if ratios else "undecided (no rounds)"
    mean = statistics.fmean(ratios)
    spread = statistics.stdev(ratios) / len(ratios) ** 0.5
    text = f"mean ratio {mean:.4f} +- {spread * 100:.2f}% (standard error over {len(ratios)} rounds)"
    if spread >= target - 1:
        return f"undecided: {text}, the spread is not below {(target - 1) * 100:g}%"
    return f"{'met' if mean <= target else 'NOT met'}: {text}"


def callgrind_instructions(module_args: list, timeout: float, **env) -> int:
    """Instructions a whole `python -m <module_args>` process executed (every thread), from callgrind's summary;
    exits with the run's error when it failed or printed no count (the instruction-count benchmarks)."""
    with tempfile.TemporaryDirectory(prefix="ddpwatch-callgrind-") as folder:
        out = f"--callgrind-out-file={os.path.join(folder, 'out')}"
        command = ["valgrind", "--tool=callgrind", out, sys.executable, "-m", *module_args]
        code, _, err = run_bounded(command, timeout=timeout, env=dict(child_env(), PYTHONHASHSEED="0", **env))
    found = re.search(r"Collected : (\d+)", err)
    if code != 0 or not found:
        raise SystemExit(f"callgrind run of {' '.join(module_args)} failed (exit {code}):\n{err[-2000:]}")
    return int(found.group(1))
