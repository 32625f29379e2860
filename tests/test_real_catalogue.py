"""One real multi-process reproduction per finding kind of the catalogue (gloo, 2-3 ranks, hard time limits)."""

import os

import pytest

from ranks import SCENARIOS, describe, load_only_report, reported_and_exited, reports, run_case, tagged_line

CATALOGUE = os.path.join(SCENARIOS, "catalogue.py")
pytestmark = pytest.mark.timeout(120)


# The fact each reproduction's verdict rests on (analysis/table.py: Stage.proves): under action=abort each kind of
# fact still ends the job (issue 40), and the report says which fact it was.
FACTS = {
    "ddp_forward_on_subset": ("explained", "calls_never_match"),
    "skipped_collective": ("explained", "calls_never_match"),
    "uneven_inputs": ("explained", "calls_never_match"),
    "shape_mismatch": ("fact", "calls_never_match"),
    "group_order": ("fact", "waits_in_a_cycle"),
    "collective_stuck": ("fact", "wait_past_timeout"),
    "unresponsive_rank": ("fact", "silent_rank"),
    "dead_rank": ("fact", "silent_rank"),
}


def finding_of(tmp_path, results):
    incident = load_only_report(tmp_path)
    assert len(incident["findings"]) == 1, (incident["findings"], describe(results))
    finding = incident["findings"][0]
    basis = finding["basis"]
    assert (basis["status"], basis["fact"], basis["acts"]) == (*FACTS[finding["kind"]], True), basis
    return incident, finding


def line(tag):
    return tagged_line(CATALOGUE, tag)


def test_rank0_forward_after_the_first_backward_blocks_in_the_bucket_rebuild(tmp_path):
    results = run_case([CATALOGUE, "rebuild"], 2, tmp_path, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    incident, finding = finding_of(tmp_path, results)
    assert finding["kind"] == "ddp_forward_on_subset"
    assert finding["ranks"] == [0]
    assert finding["evidence"]["ddp_op"] == "bucket_rebuild"
    assert finding["location"]["line"] == line("rebuild_call")
    assert "rebuild" in finding["fix"]
    assert finding["evidence"]["rank_condition"]["0"]["condition"]["text"] == "if rank == 0:"
    flight = incident["ranks"][0]["flight_recorder"]
    assert flight["entries"] and flight["entries"][-1]["op"] == "broadcast"


def test_skipped_barrier_names_the_rank_that_did_not_arrive(tmp_path):
    results = run_case([CATALOGUE, "skipped"], 2, tmp_path, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    _, finding = finding_of(tmp_path, results)
    assert finding["kind"] == "skipped_collective"
    assert finding["ranks"] == [1]
    assert finding["location"]["line"] == line("skip_barrier")
    assert "skip_step" not in finding["summary"] and "catalogue.py:" in finding["summary"]


def test_uneven_inputs_names_the_rank_stuck_in_backward(tmp_path):
    results = run_case([CATALOGUE, "uneven"], 2, tmp_path, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    incident, finding = finding_of(tmp_path, results)
    assert finding["kind"] == "uneven_inputs"
    assert finding["ranks"] == [0]
    assert finding["location"]["line"] == line("uneven_backward")
    assert "DistributedSampler" in finding["fix"] and "join()" in finding["fix"]
    # The Flight Recorder confirms the all-reduce that backward() issued in C++ is what rank 0 has in flight.
    [stuck] = [s for s in incident["ranks"] if s["rank"] == 0][0]["inflight"]
    assert stuck["api"] == "DDP.backward_all_reduce"
    assert stuck["flight_recorder"]["op"].replace("_", "") == "allreduce" and stuck["flight_recorder"]["seq"] > 0


def test_empty_tensor_is_a_shape_mismatch(tmp_path):
    results = run_case([CATALOGUE, "shape"], 2, tmp_path, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    _, finding = finding_of(tmp_path, results)
    assert finding["kind"] == "shape_mismatch"
    assert finding["ranks"] == [1]
    assert finding["location"]["line"] == line("shape_all_reduce")


def test_two_groups_in_opposite_orders_is_group_order(tmp_path):
    results = run_case([CATALOGUE, "group_order"], 2, tmp_path, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    _, finding = finding_of(tmp_path, results)
    assert finding["kind"] == "group_order"
    assert finding["ranks"] == [0, 1]
    assert finding["location"]["line"] in (line("order_first"), line("order_second"))


@pytest.mark.skipif(
    os.environ.get("DDPWATCH_RECORDER") == "flight",
    reason="the scenario's transport fault is a Python function standing in for all_reduce: it never reaches c10d, "
    "so torch's Flight Recorder has no op to show; a real stalled transport blocks inside c10d, where it does",
)
def test_a_collective_that_never_completes_anywhere_is_collective_stuck(tmp_path):
    results = run_case([CATALOGUE, "stuck"], 2, tmp_path, DDPWATCH_ACTION="abort", DDPWATCH_TIMEOUT=4)
    assert all(r.returncode == 3 for r in results), describe(results)
    incident, finding = finding_of(tmp_path, results)
    assert incident["trigger"] == "timeout"
    assert finding["kind"] == "collective_stuck"
    assert finding["ranks"] == [0, 1]
    assert finding["location"]["line"] == line("stuck_all_reduce")


def test_a_stopped_rank_is_unresponsive_with_its_process_state(tmp_path):
    results = run_case(
        [CATALOGUE, "unresponsive"],
        2,
        tmp_path,
        timeout=60,
        DDPWATCH_ACTION="report",
        DDPWATCH_DEAD_AFTER=4,
        stop_when=lambda: bool(reports(tmp_path)),
    )
    incident, finding = finding_of(tmp_path, results)
    assert finding["kind"] == "unresponsive_rank"
    assert finding["ranks"] == [1]
    assert finding["evidence"]["process"]["status"] == "stopped"
    assert finding["location"]["line"] == line("stopped")


def test_a_vanished_rank_is_dead(tmp_path):
    # Rank 2 sleeps 60 s, alive outside collectives: the job is stopped once rank 0 has acted on the verdict.
    results = run_case(
        [CATALOGUE, "dead"],
        3,
        tmp_path,
        timeout=60,
        stop_when=reported_and_exited(tmp_path, 0),
        DDPWATCH_ACTION="abort",
        DDPWATCH_DEAD_AFTER=4,
    )
    assert results[1].returncode == 1 and results[0].returncode == 3, describe(results)
    _, finding = finding_of(tmp_path, results)
    assert finding["kind"] == "dead_rank"
    assert finding["ranks"] == [1]
    assert finding["evidence"]["process"] == {"exists": False} or finding["evidence"]["process"]["exists"] is False
