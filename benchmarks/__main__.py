"""`python -m benchmarks [--quick] [--only NAME ...]`: runs every benchmark, each in its own bounded process."""

from __future__ import annotations

import sys
import time

from . import _common as C

# name -> seconds it may take (full mode; quick mode gets a quarter): far above a normal run, so only a hang hits it.
BENCHMARKS = {
    "whole_job": 3600,  # the benchmark of record: whole torchrun jobs armed vs plain (15-25 minutes; --quick: 1-2)
    "overhead_ops": 900,
    "attribution": 900,  # which part of the guard costs what on gloo, the NCCL-like backend and a DDP loop
    "hot_path_instructions": 900,  # needs valgrind; says so and measures nothing without it
    "op_instructions": 2400,  # needs valgrind (fails without it): real torch under callgrind, 8 processes
    "overhead_training": 900,
    "time_to_verdict": 900,
    "scale": 1200,
    "store_load": 1200,  # the store server in a process of its own under 1k-16k simulated ranks (a few minutes)
    "look_parts": 600,  # the leader's look at 16,384 positions, part by part, three layouts (about 2 minutes)
    "assess_growth": 600,  # the assessment at 1,024 and 4,096 ranks, eleven hang layouts (under a minute)
    "memory": 600,
    "startup": 600,
    "step_cost": 600,
    "flight_recorder": 300,
    "soak": 3000,  # 10 minutes of benign training by default; --quick: 30 s
}


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run only these benchmarks")
    opts = args.parse_args(argv)
    failed = []
    for name in opts.only or BENCHMARKS:
        limit = BENCHMARKS[name] / (4 if opts.quick else 1)
        start = time.monotonic()
        command = [sys.executable, "-m", f"benchmarks.{name}"] + (["--quick"] if opts.quick else [])
        code, _, _ = C.run_bounded(command, timeout=limit, capture=False)  # output goes straight to ours
        print(
            f"[{name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {time.monotonic() - start:.0f} s]\n",
            flush=True,
        )
        if code != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
