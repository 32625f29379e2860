"""Start-up cost of installing ddpwatch for Python programs that do not use it: `python -c pass`, with and without.

Builds throwaway virtual environments (no pip, no system site-packages): `bare`, and `installed`: the same plus
this checkout's ddpwatch-startup.pth and a path entry for the checkout (what `pip install -e .` adds). Runs
`python -c pass` in each, interleaved (bare, installed, DDPWATCH=1, DDPWATCH=1, installed, bare) round after
round, and prints the medians and ratios. `DDPWATCH=1` is what a guarded process pays at start-up (configuration
read, import hook registered; torch is not imported then).

Then what a rank pays when the guard starts (the second table): a 1-rank gloo process group, with and without
`ddpwatch.guard()`, interleaved; each run reports its own CPU time (user + system) and the modules it imported from
just after `import torch` to just after its first all_reduce. Before 7dd8580 the guard imported FSDP2 to
patch it (DTensor, sympy, dynamo); it now patches FSDP2 only once the program imports it.

python -m benchmarks.startup [--quick] [--rounds N]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv

from . import _common as C

ROUNDS = {"full": 60, "quick": 12}
GUARD_ROUNDS = {"full": 10, "quick": 2}
GUARD_START = """
import resource, sys, time
import torch, torch.distributed as dist
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
start, modules = cpu(), len(sys.modules)
dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1)
if sys.argv[2] == "guarded":
    import ddpwatch
    guard = ddpwatch.guard()
    guard.__enter__()
dist.all_reduce(torch.ones(1))
print(f"GUARD-START {cpu() - start:.4f} {len(sys.modules) - modules} {int('sympy' in sys.modules)}")
if sys.argv[2] == "guarded":
    guard.__exit__(None, None, None)
dist.destroy_process_group()
"""
PTH = os.path.join(C.ROOT, "ddpwatch-startup.pth")


def make_venv(folder: str, installed: bool) -> str:
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(folder)
    python = os.path.join(folder, "Scripts" if os.name == "nt" else "bin", "python")
    if installed:
        site_dir = subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
        shutil.copy(PTH, site_dir)
        with open(os.path.join(site_dir, "ddpwatch-checkout.pth"), "w") as handle:
            handle.write(C.ROOT + "\n")
    return python


def time_once(python: str, env: dict, cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", "pass"], env=env, cwd=cwd, check=True, stdin=subprocess.DEVNULL, timeout=60)
    return time.perf_counter() - start


def measure(rounds: int) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DDPWATCH") and k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="ddpwatch-startup-") as folder:
        bare = make_venv(os.path.join(folder, "bare"), installed=False)
        installed = make_venv(os.path.join(folder, "installed"), installed=True)
        cwd = os.path.join(folder, "cwd")  # no setup.cfg / pyproject.toml to read
        os.mkdir(cwd)
        cases = {
            "bare": (bare, base),
            "installed, DDPWATCH unset": (installed, base),
            "installed, DDPWATCH=1": (installed, dict(base, DDPWATCH="1")),
        }
        for python, env in cases.values():
            time_once(python, env, cwd)  # warm the file cache
        times = {name: [] for name in cases}
        order = list(cases) + list(reversed(list(cases)))
        for _ in range(rounds):
            for name in order:
                python, env = cases[name]
                times[name].append(time_once(python, env, cwd))
    return times


def guard_start_once(arm: str, folder: str, index: int) -> tuple:
    """(CPU seconds, modules imported, sympy imported) of one 1-rank process, from after `import torch`."""
    store = f"file://{os.path.join(folder, f'store-{arm}-{index}')}"
    env = C.child_env(DDPWATCH_DIR=os.path.join(folder, "reports"))
    done = subprocess.run(
        [sys.executable, "-c", GUARD_START, store, arm], env=env, capture_output=True, text=True, timeout=120
    )
    found = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("GUARD-START ")]
    if done.returncode != 0 or not found:
        raise RuntimeError(f"guard start-up run ({arm}) failed, exit {done.returncode}: {done.stderr[-2000:]}")
    cpu, modules, sympy = found[0]
    return float(cpu), int(modules), bool(int(sympy))


def measure_guard_start(rounds: int) -> dict:
    runs: dict = {"plain": [], "guarded": []}
    with tempfile.TemporaryDirectory(prefix="ddpwatch-guard-start-") as folder:
        for index in range(rounds):
            for arm in ("plain", "guarded", "guarded", "plain"):
                runs[arm].append(guard_start_once(arm, folder, len(runs[arm]) + 4 * index))
    return runs


def guard_start_rows(runs: dict) -> list:
    rows = []
    plain = statistics.median(cpu for cpu, _, _ in runs["plain"])
    for arm, samples in runs.items():
        cpus = [cpu for cpu, _, _ in samples]
        rows.append(
            [
                arm,
                len(samples),
                statistics.median(cpus) * 1000,
                min(cpus) * 1000,
                max(cpus) * 1000,
                (statistics.median(cpus) - plain) * 1000,
                max(modules for _, modules, _ in samples),
                "yes" if any(sympy for _, _, sympy in samples) else "no",
            ]
        )
    return rows


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--rounds", type=int, help="rounds of the interleaved sequence (each runs every case twice)")
    opts = args.parse_args(argv)
    mode = "quick" if opts.quick else "full"
    C.header("startup", opts.quick)
    times = measure(opts.rounds or ROUNDS[mode])
    bare = statistics.median(times["bare"])
    rows = []
    for name, samples in times.items():
        samples = sorted(samples)
        median = statistics.median(samples)
        rows.append(
            [
                name,
                len(samples),
                median * 1000,
                samples[len(samples) // 10] * 1000,
                samples[(9 * len(samples)) // 10] * 1000,
                (median - bare) * 1000,
                median / bare,
            ]
        )
    C.print_table(
        "`python -c pass`, wall time per start (ms)", ["case", "runs", "median", "p10", "p90", "added", "ratio"], rows
    )
    print(
        f"ddpwatch installed, DDPWATCH unset: {rows[1][6]:.3f}x the bare start-up "
        f"({rows[1][5]:+.1f} ms); DDPWATCH=1: {rows[2][6]:.2f}x ({rows[2][5]:+.1f} ms)"
    )
    C.print_table(
        "A rank's start, 1-rank gloo group: process CPU (ms) from after `import torch` to after the first all_reduce",
        ["arm", "runs", "median", "min", "max", "added", "modules imported", "sympy imported"],
        guard_start_rows(measure_guard_start(opts.rounds or GUARD_ROUNDS[mode])),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
