"""The node relay with real ranks (issue 45): gloo ranks grouped into nodes on this host (tests/scenarios/nodes.py);
a node leader that stops does not blind its node."""

import os

import pytest

from ranks import SCENARIOS, describe, load_only_report, reports, run_case, tagged_line

pytestmark = pytest.mark.real
NODES = os.path.join(SCENARIOS, "nodes.py")
FAST = {"DDPWATCH_INTERVAL": "0.5", "DDPWATCH_DEAD_AFTER": "2", "DDPWATCH_ACTION": "report"}


def test_a_node_leader_that_stops_is_unresponsive_and_its_node_mate_still_answers(tmp_path):
    results = run_case(
        [NODES, "leader_stops"], 3, tmp_path, timeout=90, stop_when=lambda: bool(reports(tmp_path)), **FAST
    )
    assert reports(tmp_path), describe(results)
    report = load_only_report(tmp_path)
    finding = report["findings"][0]
    assert finding["kind"] == "unresponsive_rank" and finding["ranks"] == [1], describe(results)
    assert finding["evidence"]["process"]["status"] == "stopped"
    by_rank = {state["rank"]: state for state in report["ranks"]}
    # rank 2's running beats reached the store only through rank 1 until rank 2 took its node over: its own answer
    # (with its stacks, at the line where it computes) shows that it read the incident through the relay it leads
    straggler = by_rank[2]
    assert straggler.get("stacks"), "rank 2 did not answer: its node went blind when its leader stopped"
    lines = [frame.get("line") for stack in straggler["stacks"] if stack.get("main") for frame in stack["frames"]]
    assert tagged_line(NODES, "straggling") in lines


def test_a_correct_job_through_the_relay_ends_cleanly_with_no_report(tmp_path):
    results = run_case([NODES, "healthy"], 2, tmp_path, timeout=60, DDPWATCH_RELAY="on", **FAST)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert not reports(tmp_path)


def test_a_straggler_is_reported_while_its_peers_wait_on_one_node_whose_leader_carries_their_beats(tmp_path):
    """Ranks 1 and 2 wait on one node; after their first blocked round their positions reach the store through rank
    1, their node's blocked leader (NodeRelay.carries). The straggler, rank 0 asleep outside collectives, is reported
    at its line once the wait outlasts the timeout, and neither waiting rank is taken for silent. (Whether the beats
    were carried is counted by tests/test_node_relay.py; this checks the verdict through it.)"""
    results = run_case(
        [NODES, "node_waits"],
        3,
        tmp_path,
        timeout=90,
        stop_when=lambda: bool(reports(tmp_path)),
        DDPWATCH_TIMEOUT="4",
        **FAST,
    )
    assert reports(tmp_path), describe(results)
    report = load_only_report(tmp_path)
    finding = report["findings"][0]
    assert finding["kind"] == "straggler" and finding["ranks"] == [0], describe(results)
    assert finding["evidence"]["waiting"] == [1, 2]
    assert finding["evidence"]["busy_at"]["0"]["line"] == tagged_line(NODES, "sleeping")
    assert report["silent"] == {}, "a waiting rank whose beats went through its node's leader was taken for silent"
