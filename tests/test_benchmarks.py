"""Every benchmark runs in --quick mode and prints its table; timings are never asserted (this machine is noisy)."""

import os
import re
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.real  # every test runs a benchmark in a process of its own

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# memory: runner; hot_path_instructions: its cases below (valgrind takes 45 s)
BENCHMARKS = ["overhead_ops", "attribution", "overhead_training", "time_to_verdict", "scale", "soak", "startup",
              "step_cost", "flight_recorder", "forged_incidents"]
LIMIT_S = 150  # hard limit per quick run; each takes 5-25 s here
TABLE_ROW = re.compile(r"^\|.*\|$", re.MULTILINE)
TABLE_RULE = re.compile(r"^\|-[-|]*\|$", re.MULTILINE)


def run_quick(args):
    """Run `python -m <args>` in its own process group; kill the whole group at the limit or on any failure."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DDPWATCH", None)
    proc = subprocess.Popen([sys.executable, "-m"] + args, cwd=ROOT, env=env, text=True, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{args} still running after {LIMIT_S} s\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything it started and left behind
        except (ProcessLookupError, PermissionError):
            pass
    return proc.returncode, out, err


# Quick modes that run for a set time, shortened further here: the test checks that the table is printed.
SHORTER = {"forged_incidents": ["--seconds", "3"], "soak": ["--minutes", "0.15"]}


@pytest.mark.timeout(LIMIT_S + 30)
@pytest.mark.parametrize("name", BENCHMARKS)
def test_quick_mode_runs_and_prints_its_table(name):
    code, out, err = run_quick([f"benchmarks.{name}", "--quick"] + SHORTER.get(name, []))
    assert code == 0, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    assert f"== {name}" in out and "(quick mode)" in out
    assert TABLE_RULE.search(out) and len(TABLE_ROW.findall(out)) >= 3, out


@pytest.mark.timeout(LIMIT_S + 30)
def test_runner_runs_the_chosen_benchmark_in_quick_mode():
    code, out, err = run_quick(["benchmarks", "--quick", "--only", "memory"])
    assert code == 0, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    assert "== memory" in out and "(quick mode)" in out and "[memory: ok" in out
    assert TABLE_RULE.search(out) and len(TABLE_ROW.findall(out)) >= 3, out
    assert "== scale" not in out


@pytest.mark.timeout(LIMIT_S + 30)
@pytest.mark.parametrize("case", ["bare", "wrapped", "record", "not_member"])
def test_each_instruction_count_case_runs_without_valgrind(case):
    code, out, err = run_quick(["benchmarks.hot_path_instructions", "--worker", case, "200"])
    assert code == 0, f"exit {code}\n{err[-3000:]}"
