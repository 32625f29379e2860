"""Real point-to-point hangs on 2-3 gloo ranks (hard time limits): the cycle, the culprit, the line and the fix; and
the exchanges that only look like hangs stay silent."""

import json
import os

import pytest

from ranks import SCENARIOS, describe, hang_formed_at, load_only_report, reports, run_case, tagged_line

P2P = os.path.join(SCENARIOS, "p2p.py")
pytestmark = pytest.mark.timeout(120)


def hang(tmp_path, case, nprocs=2):
    results = run_case([P2P, case], nprocs, tmp_path, timeout=60, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    incident = load_only_report(tmp_path)
    assert [f["kind"] for f in incident["findings"]] == ["p2p_deadlock"], (incident["findings"], describe(results))
    finding = incident["findings"][0]
    assert incident["created_at"] - hang_formed_at(results) < 5.0  # proven, not timed out (300 s)
    return finding


def read_json(path):
    with open(path) as handle:
        return json.load(handle)


def line(tag):
    return tagged_line(P2P, tag)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_every_rank_sending_first_is_a_send_cycle_through_all_of_them(tmp_path, nprocs):
    finding = hang(tmp_path, "send_first", nprocs)
    assert finding["ranks"] == list(range(nprocs))
    assert finding["evidence"]["shape"] == "send_first"
    assert [s["waits_for"] for s in finding["evidence"]["cycle"]] == [(r + 1) % nprocs for r in range(nprocs)]
    assert finding["location"]["line"] == line("send_first")
    assert "irecv" in finding["fix"] and "parity" in finding["fix"]


def test_irecvs_waited_on_before_any_send_are_a_recv_cycle(tmp_path):
    finding = hang(tmp_path, "recv_first")
    assert (finding["ranks"], finding["evidence"]["shape"]) == ([0, 1], "recv_first")
    assert finding["location"]["line"] == line("recv_wait")  # where it blocks; the irecv's line is said too
    assert f"issued at p2p.py:{line('recv_first')}, waited on at p2p.py:{line('recv_wait')}" in finding["summary"]
    assert "irecv from rank 1, waited on" in finding["evidence"]["mismatched"][0]["description"]


def test_a_recv_with_another_tag_is_the_unmatched_pair_named_at_the_recv(tmp_path):
    finding = hang(tmp_path, "wrong_tag")
    assert (finding["ranks"], finding["evidence"]["shape"]) == ([0, 1], "unmatched")
    assert finding["location"]["line"] == line("tag_recv")
    assert "tag 8" in finding["summary"] and "tag 7" in finding["fix"]


def test_a_recv_from_the_wrong_source_names_the_sender_and_the_receiver(tmp_path):
    finding = hang(tmp_path, "wrong_source", 3)
    assert (finding["ranks"], finding["evidence"]["shape"]) == ([0, 1], "unmatched")
    assert finding["location"]["line"] == line("source_recv")
    assert [s["rank"] for s in finding["evidence"]["cycle"]] == [0, 1, 2]


def test_a_stage_with_one_microbatch_more_than_its_peer_is_named_with_both_counts(tmp_path):
    finding = hang(tmp_path, "microbatches")
    assert (finding["ranks"], finding["evidence"]["shape"]) == ([0, 1], "into_collective")
    assert finding["location"]["line"] == line("stage_send")
    assert f"send #4 to rank 1 at p2p.py:{line('stage_send')}; rank 1 has received 3 from it" in finding["summary"]
    assert "microbatches" in finding["fix"]
    collective = finding["evidence"]["cycle"][1]
    assert (collective["rank"], collective["op"], collective["site"]["line"]) == (
        1,
        "all_reduce",
        line("stage_all_reduce"),
    )


def test_a_rank_whose_helper_returns_before_its_send_is_the_culprit_at_its_return(tmp_path):
    """Issue 42: before, both ends (rank 0 at its recv, rank 2) with a fix suggesting to remove the receive."""
    finding = hang(tmp_path, "errors_return", 3)
    assert (finding["ranks"], finding["evidence"]["shape"]) == ([2], "into_collective")
    assert finding["location"]["line"] == line("no_errors_return")
    [gone] = finding["evidence"]["went_on"]
    assert (gone["rank"], gone["half"], gone["count"], gone["peer_count"]) == (2, "send", 2, 3)
    assert gone["exit"]["half_site"]["line"] == line("errors_send") and gone["exit"]["half_of"] == 2  # its own
    assert "Make rank 2 send on every path" in finding["fix"]
    assert "(observed in the run)" in finding["summary"] and "read from the source" in finding["summary"]


def test_a_rank_that_skips_a_send_with_continue_is_the_culprit_at_its_continue(tmp_path):
    finding = hang(tmp_path, "skip_continue")
    assert finding["ranks"] == [1] and finding["location"]["line"] == line("skip_continue")
    assert finding["evidence"]["went_on"][0]["exit"]["kind"] == "continue"


def test_batch_isend_irecv_lists_that_do_not_pair_are_named_where_the_batch_is_waited_on(tmp_path):
    finding = hang(tmp_path, "batch_unpaired")
    assert (finding["ranks"], finding["evidence"]["shape"]) == ([0, 1], "into_collective")
    assert finding["location"]["line"] == line("batch_wait")
    assert "lists must pair" in finding["fix"]
    assert "batch_isend_irecv (send to rank 1, recv from rank 1)" in finding["evidence"]["mismatched"][0]["description"]


def test_pipelining_stages_with_different_microbatch_counts_are_named_with_the_schedule_fix(tmp_path):
    finding = hang(tmp_path, "pipeline_microbatches")
    assert (finding["ranks"], finding["evidence"]["shape"]) == ([0, 1], "pipeline")
    assert finding["location"]["line"] in (line("pipeline_step_first"), line("pipeline_step_last"))
    assert "n_microbatches" in finding["fix"] and "torch.distributed.pipelining" in finding["summary"]


@pytest.mark.parametrize("case,nprocs", [("exchange_ok", 3), ("slow_stage", 2), ("prefetch", 2), ("pipeline_ok", 2)])
def test_exchanges_that_only_look_like_hangs_finish_without_a_report(tmp_path, case, nprocs):
    results = run_case([P2P, case], nprocs, tmp_path, timeout=60, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 0 for r in results), describe(results)
    assert reports(tmp_path) == []


def test_a_slow_pipeline_stage_is_a_straggler_after_the_timeout_never_a_deadlock(tmp_path):
    results = run_case([P2P, "slow_stage"], 2, tmp_path, timeout=60, DDPWATCH_ACTION="report", DDPWATCH_TIMEOUT="2")
    assert all(r.returncode == 0 for r in results), describe(results)
    found = [read_json(path) for path in reports(tmp_path)]
    assert found, "the 3 s stage outlasts the 2 s timeout: a straggler report"
    assert {(f["kind"], tuple(f["ranks"])) for incident in found for f in incident["findings"]} == {("straggler", (1,))}
