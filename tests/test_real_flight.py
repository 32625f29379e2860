"""The flight recorder (recorder=flight) end to end on gloo: hangs caught, and benign runs left alone, from torch's
own Flight Recorder with no wrapper on any collective; where it is off, the python recorder, said so."""

import os

import pytest

from ranks import SCENARIOS, describe, load_only_report, reports, run_case, tagged_line

import ddpwatch.examples.seed_stall as seed

SEED = seed.__file__
HANGS = os.path.join(SCENARIOS, "hangs.py")
FLIGHT = {"DDPWATCH_RECORDER": "flight", "DDPWATCH_ACTION": "abort"}
pytestmark = pytest.mark.timeout(150)


def test_the_seed_stall_from_the_flight_recorder_is_ddp_forward_on_subset_at_the_users_line(tmp_path):
    results = run_case(["-m", "ddpwatch.examples.seed_stall", "--mark"], 2, tmp_path, **FLIGHT)
    assert all(r.returncode == 3 for r in results), describe(results)
    incident = load_only_report(tmp_path)
    assert [state["recorder"] for state in incident["ranks"]] == ["flight", "flight"]
    [finding] = incident["findings"]
    assert (finding["kind"], finding["ranks"]) == ("ddp_forward_on_subset", [0])
    assert finding["location"]["line"] == tagged_line(SEED, "seed_ddp_call")
    assert finding["evidence"]["ddp_op"] == "buffer_broadcast"
    [waiting] = [row for row in finding["evidence"]["mismatched"] if 0 not in row["ranks"]]
    assert waiting["op"] == "barrier" and waiting["site"]["line"] == tagged_line(SEED, "seed_epoch_barrier")
    text = open(os.path.join(os.path.dirname(reports(tmp_path)[0]), "report.txt")).read()
    assert "recorded by: torch's Flight Recorder (recorder=flight)" in text


def test_the_fixed_seed_loop_under_the_flight_recorder_finishes_with_no_report(tmp_path):
    results = run_case(["-m", "ddpwatch.examples.seed_stall", "--fixed"], 2, tmp_path, **FLIGHT)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == []


def test_a_rank_busy_for_less_than_the_timeout_is_no_hang_for_the_flight_recorder(tmp_path):
    results = run_case([HANGS, "busy:6"], 2, tmp_path, DDPWATCH_TIMEOUT=12, **FLIGHT)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == []


def test_a_rank0_only_all_reduce_from_the_flight_recorder_is_collective_on_subset(tmp_path):
    results = run_case([HANGS, "collective_on_subset"], 2, tmp_path, **FLIGHT)
    assert all(r.returncode == 3 for r in results), describe(results)
    [finding] = load_only_report(tmp_path)["findings"]
    assert (finding["kind"], finding["ranks"]) == ("collective_on_subset", [0])
    assert finding["location"]["line"] == tagged_line(HANGS, "subset_all_reduce")


@pytest.mark.parametrize("recorder", ["flight", "python"])
def test_an_async_collective_whose_thread_waits_outside_torch_is_a_mismatch_under_both_recorders(tmp_path, recorder):
    """No thread of rank 0 waits inside torch (it polls is_completed() in a sleep loop): the flight recorder finds
    its all_reduce pending from the Flight Recorder's own status, and places it at the line that issued it."""
    results = run_case([HANGS, "async_polled"], 2, tmp_path, DDPWATCH_RECORDER=recorder, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    incident = load_only_report(tmp_path)
    assert [state["recorder"] for state in incident["ranks"]] == [recorder, recorder]
    [finding] = incident["findings"]
    assert finding["kind"] == "collective_mismatch", finding
    lines = {row["op"]: row["site"]["line"] for row in finding["evidence"]["mismatched"]}
    assert lines == {
        "all_reduce": tagged_line(HANGS, "polled_all_reduce"),
        "broadcast": tagged_line(HANGS, "polled_broadcast"),
    }


def test_a_reduce_op_a_rank_waits_inside_is_read_as_given_not_as_sum(tmp_path):
    """MIN on every rank, rank 0 waiting inside each call: a look found the call before its op was noted, read it
    as SUM and reported a silent_mismatch against the peer's MIN (2 runs of 2 before the fix, on a correct job)."""
    results = run_case([HANGS, "min_waited"], 2, tmp_path, **FLIGHT)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == [], describe(results)


def test_flight_asked_for_with_the_flight_recorder_off_records_with_python_and_says_why(tmp_path):
    results = run_case(
        ["-m", "ddpwatch.examples.seed_stall", "--mark"], 2, tmp_path, TORCH_FR_BUFFER_SIZE="0", **FLIGHT
    )
    assert all(r.returncode == 3 for r in results), describe(results)
    assert all("TORCH_FR_BUFFER_SIZE=0 turns the Flight Recorder off" in r.stderr for r in results), describe(results)
    incident = load_only_report(tmp_path)
    assert [state["recorder"] for state in incident["ranks"]] == ["python", "python"]
    [finding] = incident["findings"]
    assert finding["kind"] == "ddp_forward_on_subset"
    assert finding["location"]["line"] == tagged_line(SEED, "seed_ddp_call")
