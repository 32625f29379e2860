"""Every benchmark runs in --quick mode and prints its table; timings are never asserted (this machine is noisy).

The bench tier: left out of the suite (setup.cfg's addopts), run by `python -m pytest -q -n 3 -m bench` and by CI
as a step of its own."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from ddpwatch.launch import kill_tree

pytestmark = [pytest.mark.real, pytest.mark.bench]  # every test runs a benchmark in a process of its own

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# memory: runner; hot_path_instructions, op_instructions: their cases below (valgrind: 45 s, and minutes)
BENCHMARKS = [
    "overhead_ops",
    "attribution",
    "overhead_training",
    "time_to_verdict",
    "scale",
    "look_parts",
    "assess_growth",
    "soak",
    "startup",
    "step_cost",
    "flight_recorder",
    "forged_incidents",
    "native_tools",
]
LIMIT_S = 150  # hard limit per quick run; each takes 5-25 s here
TABLE_ROW = re.compile(r"^\|.*\|$", re.MULTILINE)
TABLE_RULE = re.compile(r"^\|-[-|]*\|$", re.MULTILINE)


def run_quick(args, limit=LIMIT_S):
    """Run `python -m <args>` in its own process group; kill the whole group at the limit or on any failure."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DDPWATCH", None)
    proc = subprocess.Popen(
        [sys.executable, "-m"] + args,
        cwd=ROOT,
        env=env,
        text=True,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # torchrun's ranks run in sessions of their own, out of reach of the group's kill
        out, err = proc.communicate()
        pytest.fail(f"{args} still running after {limit} s\n{out[-3000:]}\n{err[-3000:]}")
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


@pytest.mark.timeout(LIMIT_S + 30)
@pytest.mark.parametrize("case", [("fake", "0"), ("fake", "1"), ("gloo", "0"), ("gloo", "1")])
def test_each_real_op_instruction_case_runs_without_valgrind(case):
    code, out, err = run_quick(["benchmarks.op_instructions", "--worker", *case, "50"])
    assert code == 0, f"exit {code}\n{err[-3000:]}"


@pytest.mark.timeout(LIMIT_S + 30)
def test_store_load_quick_mode_measures_every_phase_and_prints_its_tables(tmp_path):
    """benchmarks/store_load.py: the store server in its own process, two clients of simulated ranks under each
    protocol, the job's probe, the replays at the model's rates; every size's healthy and hang phase counted store
    operations, the probe ran, the model was fitted. Structure and counts only, never a timing."""
    path = tmp_path / "store_load.json"
    code, out, err = run_quick(["benchmarks.store_load", "--quick", "--json", str(path)])
    assert code == 0, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    assert "== store_load" in out and "(quick mode)" in out and "EXTRAPOLATION" in out
    assert TABLE_RULE.search(out) and len(TABLE_ROW.findall(out)) >= (2 + 8) + (2 + 5) + (2 + 14) + (2 + 3), out
    doc = json.loads(path.read_text())
    expected = [(64, "rank"), (64, "node"), (256, "rank"), (256, "node")]
    assert [(s["ranks"], s["protocol"]) for s in doc["sizes"]] == expected
    assert doc["problems"] == []
    for size in doc["sizes"]:
        for phase in ("healthy", "hang"):
            assert size[phase]["ops"] > 0 and size[phase]["rounds"] >= 1
        assert size["hang"]["latest_incident"] == 0  # the hang stayed incident-free
        assert size["healthy"]["harm"]["probes"] > 0 and size["healthy"]["harm"]["barriers"] > 0
    for ranks in (64, 256):  # counted, not timed: the relay's node makes fewer round trips than its ranks did
        by = {s["protocol"]: s["healthy"]["ops_per_rank_interval"] for s in doc["sizes"] if s["ranks"] == ranks}
        assert by["node"] < by["rank"] / 4, by
        # in the hang, each blocked rank's 9 looks between rounds: at the store itself (rank), through its node
        # leader's post (node: the leader's 9 reads for its 8 ranks); the rounds' own round trips alike in both
        hang = {s["protocol"]: s["hang"]["ops_per_rank_interval"] for s in doc["sizes"] if s["ranks"] == ranks}
        assert hang["rank"] > 12 and hang["node"] < hang["rank"] / 2, hang
    assert doc["model"]["ranks"] == 65536 and doc["model"]["node"]["ops_per_s"] > 0 < doc["model"]["rank"]["ops_per_s"]
    # the replays twice: every process on every core, then the server's threads alone on one core (2+ cores here)
    layouts = ["shared", "server alone"] if len(os.sched_getaffinity(0)) > 1 else ["shared"]
    assert [(r["cpus"], r["mix"]) for r in doc["replays"]] == [
        (c, m) for c in layouts for m in ("none", "rank", "node")
    ]
    assert all(r["probes"] > 0 for r in doc["replays"]) and all(
        r["achieved"] > 0 for r in doc["replays"] if r["mix"] != "none"
    )


WHOLE_JOB_LIMIT_S = 300  # 10 torchrun launches of a few seconds each: 45-85 s here
WHOLE_JOB_MEASURES = ("loop_wall_s", "job_cpu_s", "total_wall_s")


@pytest.mark.timeout(WHOLE_JOB_LIMIT_S + 30)
def test_whole_job_quick_mode_runs_every_job_and_level_and_its_attribution_adds_up(tmp_path):
    """The structure of benchmarks/whole_job.py's output, never a timing: every job plain and armed, the ddp job at
    every attribution level, each run what its label says (the ranks report what ddpwatch had on), the attribution's
    rows adding up to the main table's difference."""
    path = tmp_path / "whole_job.json"
    code, out, err = run_quick(["benchmarks.whole_job", "--quick", "--json", str(path)], WHOLE_JOB_LIMIT_S)
    assert code == 0, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    assert "== whole_job" in out and "(quick mode)" in out and "Where the difference comes from, ddp job" in out
    assert TABLE_RULE.search(out) and len(TABLE_ROW.findall(out)) >= (2 + 9) + (2 + 6), out  # the two tables
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["quick"], doc["neighbour"], doc["pairs"]) == (2, True, False, 1)
    expected = [("ddp", level) for level in range(6)] + [(job, level) for job in ("fsdp2", "many") for level in (0, 5)]
    assert sorted((run["job"], run["level"]) for run in doc["runs"]) == sorted(expected)
    assert [run["problem"] for run in doc["runs"]] == [""] * len(expected)
    for job in ("ddp", "fsdp2", "many"):
        for measure in WHOLE_JOB_MEASURES:
            stats = doc["summary"][job][measure]
            assert stats["pairs"] == 1 and len(stats["ratios"]) == 1
            assert stats["ratio_min"] <= stats["ratio"] <= stats["ratio_max"]
        for measure in ("loop_training_cpu_s", "loop_backend_cpu_s", "loop_ddpwatch_cpu_s"):  # /proc, by thread
            stats = doc["summary"][job][measure]
            assert stats["pairs"] == 1 and stats["armed"] >= 0 and stats["plain"] >= 0
        assert doc["summary"][job]["loop_ddpwatch_cpu_s"]["plain"] == 0  # no ddpwatch thread: no ratio either
        assert doc["summary"][job]["loop_ddpwatch_cpu_s"]["ratio"] is None
    assert list(doc["attribution"]) == ["ddp"]
    for measure in WHOLE_JOB_MEASURES:
        result = doc["attribution"]["ddp"][measure]
        assert list(result["rows"]) == doc["levels"][1:]
        assert sum(row["added"] for row in result["rows"].values()) == pytest.approx(result["total"])
        assert result["total"] == pytest.approx(doc["summary"]["ddp"][measure]["added"])
