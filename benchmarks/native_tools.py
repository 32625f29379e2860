"""What torch's own tools say about the seed stall, without ddpwatch: the process-group timeout, DETAIL debug mode,
monitored_barrier, and the Flight Recorder (torch's own dump on timeout, and dumps a thread takes during the hang,
read by torch's analyzer and by `ddpwatch report --flight-recorder`). 2 gloo ranks (benchmarks/seed_stall_native.py).

python -m benchmarks.native_tools [--quick] [--timeout S]

Prints, per tool, each rank's exit code and first error line, and when it came after the hang formed. The command
exits 1 when a run did not reach the hang (no hang-forms mark) or a tool could not be run: a table without its
subject is not printed as a result.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

from . import _common as C

NATIVE = os.path.join(C.ROOT, "benchmarks", "seed_stall_native.py")
TIMEOUT_S = {"full": 20, "quick": 8}
LIMIT_S = 120  # beyond the process-group timeout: start-up, two epochs, teardown
ERROR = re.compile(r"BENCH-MARK error ([0-9.]+) (.*)")
SOURCE_PREFIX = re.compile(r"\[[^\]]*\.(cc|cpp|h):[0-9]+\] ")  # gloo's "[/path/unbound_buffer.cc:129] "
FORMED = re.compile(r"DDPWATCH-MARK hang-forms ([0-9.]+)")


def run_seed(tool: str, timeout_s: int, extra_env: dict, dump_dir: str | None = None) -> dict:
    """One torchrun-free run of the seed stall under `tool`; what each rank ended with."""
    from ddpwatch.launch import run_ranks

    command = [sys.executable, NATIVE, "--timeout", str(timeout_s), "--tool", tool]
    if dump_dir:
        command += ["--dump-dir", dump_dir]
    results = run_ranks(command, 2, env=C.child_env(**extra_env), timeout=timeout_s + LIMIT_S, cwd=C.ROOT)
    formed = [float(t) for r in results for t in FORMED.findall(r.stderr)]
    row = {"codes": [r.returncode for r in results], "formed": max(formed, default=None), "said": {}}
    for r in results:
        found = ERROR.findall(r.stderr)
        if found:
            moment, words = found[0]
            row["said"][r.rank] = (float(moment), SOURCE_PREFIX.sub("", words.strip()))
        elif r.returncode is not None and r.returncode < 0:
            row["said"][r.rank] = (None, f"killed by signal {-r.returncode}; " + (_last_line(r.stderr) or "no message"))
        elif r.returncode != 0:
            row["said"][r.rank] = (None, _last_line(r.stderr))
    return row


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def said_cell(row: dict, rank: int) -> str:
    moment, words = row["said"].get(rank, (None, "(nothing)"))
    after = f"+{moment - row['formed']:.1f} s: " if moment is not None and row["formed"] is not None else ""
    return (after + words)[:220].replace("|", "/")


def stock_analyzer(folder: str) -> str:
    """torch's Flight Recorder analyzer on the dumps: its exit code and last line."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder, "--prefix", "fr_trace_"],
        capture_output=True,
        text=True,
        timeout=120,
        env=C.child_env(),
    )
    return f"exit {done.returncode}: " + _last_line(done.stdout + "\n" + done.stderr)[:150].replace("|", "/")


def ddpwatch_on_dumps(folder: str) -> str:
    import json

    done = subprocess.run(
        [sys.executable, "-m", "ddpwatch", "report", "--flight-recorder", folder, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=C.child_env(),
    )
    if done.returncode != 0:
        return f"exit {done.returncode}: " + _last_line(done.stderr)[:150]
    findings = json.loads(done.stdout).get("findings") or []
    return "; ".join(f"{f['kind']} ranks {f.get('ranks')}" for f in findings) or "no finding"


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--timeout", type=int, help="process-group timeout in seconds (default 20; --quick: 8)")
    opts = args.parse_args(argv)
    timeout_s = opts.timeout or TIMEOUT_S["quick" if opts.quick else "full"]
    C.header("native_tools: torch's own tools on the seed stall, without ddpwatch", opts.quick)
    rows, failures = [], []
    with tempfile.TemporaryDirectory(prefix="ddpwatch-native-") as scratch:
        own_dumps = os.path.join(scratch, "torch_dumps")
        taken = os.path.join(scratch, "taken")
        os.makedirs(own_dumps)
        os.makedirs(taken)
        runs = {
            "process-group timeout": run_seed("timeout", timeout_s, {}),
            "TORCH_DISTRIBUTED_DEBUG=DETAIL": run_seed("timeout", timeout_s, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
            "monitored_barrier": run_seed("monitored_barrier", timeout_s, {}),
            "Flight Recorder on (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE)": run_seed(
                "timeout",
                timeout_s,
                {"TORCH_FR_BUFFER_SIZE": 2000, "TORCH_FR_DUMP_TEMP_FILE": os.path.join(own_dumps, "fr_trace_")},
            ),
            "Flight Recorder dumped by a thread during the hang": run_seed(
                "flight_dump", timeout_s, {"TORCH_FR_BUFFER_SIZE": 2000}, dump_dir=taken
            ),
        }
        for tool, row in runs.items():
            reached = row["formed"] is not None
            if not reached and "DETAIL" not in tool:
                failures.append(f"{tool}: the run never reached the hang (exit codes {row['codes']})")
            rows.append([tool, row["codes"], "yes" if reached else "no", said_cell(row, 0), said_cell(row, 1)])
        wrote = sorted(os.listdir(own_dumps))
        dumps = sorted(name for name in os.listdir(taken) if name.startswith("fr_trace_"))
        if len(dumps) != 2:
            failures.append(f"the dumping thread wrote {dumps}, not one dump per rank")
        readers = [
            ["files torch wrote itself on the gloo timeout", ", ".join(wrote) or "none"],
            ["torch's analyzer (fr_trace) on the thread's dumps", stock_analyzer(taken) if dumps else "-"],
            ["`ddpwatch report --flight-recorder` on the same dumps", ddpwatch_on_dumps(taken) if dumps else "-"],
        ]
    C.print_table(
        f"The seed stall, 2 gloo ranks, process-group timeout {timeout_s} s; rank 0 is the culprit (its DDP forward)",
        ["tool", "exit codes", "hang formed", "rank 0 says", "rank 1 says"],
        rows,
    )
    C.print_table("The Flight Recorder's dumps", ["what", "result"], readers)
    for failure in failures:
        print(f"native_tools: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
