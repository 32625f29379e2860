"""Busy is not frozen, on real gloo ranks (issue 13 point 3): a long GIL-holding call or CPU hogs give no report."""

import os
import re
import signal
import subprocess
import sys

import pytest

from ranks import SCENARIOS, describe, load_only_report, reports, run_case

from ddpwatch.format import documents

BUSY = os.path.join(SCENARIOS, "busy.py")
DEAD_AFTER = 3
# One xdist worker runs these one after another: CPU hogs beside a GIL hold calibrated on this machine's speed made
# the hold too short for its timeout (1 run in 3 with -n 3, the file alone).
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cpu_bound")]


def held_seconds(results):
    return [float(s) for r in results for s in re.findall(r"BUSY-HELD ([0-9.]+)", r.stderr)]


def test_a_rank_holding_the_gil_12_s_between_barriers_is_busy_not_unresponsive(tmp_path):
    # Before the fix: unresponsive_rank after dead_after, and with action=abort both ranks exited 3.
    results = run_case(
        [BUSY, "gil_hold", "12"],  # 4x dead_after: the heartbeat is silent 3 times over
        2,
        tmp_path,
        timeout=180,
        DDPWATCH_ACTION="abort",
        DDPWATCH_DEAD_AFTER=DEAD_AFTER,
        DDPWATCH_TIMEOUT=150,
    )
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == [], describe(results)
    [held] = held_seconds(results)
    assert held >= 3 * DEAD_AFTER, f"the GIL was held only {held} s: the heartbeat may never have gone silent"


def test_a_rank_holding_the_gil_past_the_timeout_is_a_straggler_never_earlier(tmp_path):
    results = run_case(
        [BUSY, "gil_hold", "16"],
        2,
        tmp_path,
        timeout=150,
        DDPWATCH_ACTION="report",
        DDPWATCH_DEAD_AFTER=DEAD_AFTER,
        DDPWATCH_TIMEOUT=8,
    )
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert len(reports(tmp_path)) == 1, describe(results)
    incident = load_only_report(tmp_path)
    assert incident["trigger"] == "timeout"
    [finding] = incident["findings"]
    assert finding["kind"] == "straggler" and finding["ranks"] == [0], finding
    assert finding["evidence"]["waiting"] == [1] and finding["evidence"]["wait_s"] >= 8
    # the busy rank is in the report: its own answer, or its last published state when it could not answer
    assert sorted(state["rank"] for state in incident["ranks"]) == [0, 1]


def test_three_ranks_of_pure_python_cpu_hogs_give_no_report(tmp_path):
    results = run_case(
        [BUSY, "cpu_hogs", "10"],
        3,
        tmp_path,
        timeout=150,
        DDPWATCH_ACTION="abort",
        DDPWATCH_DEAD_AFTER=DEAD_AFTER,
        DDPWATCH_TIMEOUT=60,
    )
    assert [r.returncode for r in results] == [0, 0, 0], describe(results)
    assert reports(tmp_path) == [], describe(results)
    assert len(held_seconds(results)) == 3


def start_cpu_hogs(count, seconds):
    """`count` processes burning a core each, each ending by itself after `seconds` (bounded even if we die)."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(count)]


def stop(processes):
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        process.wait(10)


def test_gil_held_sleep_and_long_torch_work_beside_three_cpu_hogs_give_no_report_nor_abort(tmp_path):
    # Issue 18 point 3: before, rank 1 asleep in C holding the GIL was judged frozen after dead_after
    # (unresponsive_rank) and action=abort ended the correct job with codes [3, 1].
    hogs = start_cpu_hogs(3, 120)
    try:
        results = run_case(
            [BUSY, "benign_mix", "12"],
            2,
            tmp_path,
            timeout=200,
            DDPWATCH_ACTION="abort",
            DDPWATCH_DEAD_AFTER=DEAD_AFTER,
            DDPWATCH_TIMEOUT=150,
        )
    finally:
        stop(hogs)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == [], describe(results)
    held = held_seconds(results)
    assert len(held) == 2 and min(held) >= 3 * DEAD_AFTER, held


def test_a_rank_asleep_in_c_past_the_timeout_is_a_straggler_shown_with_its_native_stack(tmp_path):
    results = run_case(
        [BUSY, "gil_sleep", "16"],
        2,
        tmp_path,
        timeout=150,
        DDPWATCH_ACTION="report",
        DDPWATCH_DEAD_AFTER=DEAD_AFTER,
        DDPWATCH_TIMEOUT=7,
        DDPWATCH_NATIVE_STACKS=1,
    )
    assert [r.returncode for r in results] == [0, 0], describe(results)
    [path] = reports(tmp_path)
    incident = documents.load_incident(os.path.dirname(path))  # with the folder's native.json, written after
    [finding] = incident["findings"]
    assert finding["kind"] == "straggler" and finding["ranks"] == [1], finding
    [sleeper] = [state for state in incident["ranks"] if state["rank"] == 1]
    native = sleeper.get("native") or {}
    if "unavailable" in native:
        pytest.skip(f"py-spy cannot read another process here: {native['unavailable']}")
    functions = {frame["function"] for thread in native["threads"] for frame in thread["frames"]}
    assert {"sleep", "nanosleep", "clock_nanosleep"} & functions, functions  # where it sits: libc's sleep
