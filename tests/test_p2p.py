"""Point-to-point deadlocks on hand-built rank states (no processes): proven cycles, their shapes, and look-alikes."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import factory as F  # noqa: E402
from factory import p2p, rec, rank_state, states  # noqa: E402

from ddpwatch import analysis  # noqa: E402
from ddpwatch.render.wording import worded  # noqa: E402

GRACE, TIMEOUT_S = 0.5, 300.0


def assess(*rank_states):
    world = len(rank_states)
    return analysis.assess(states(*rank_states), world, GRACE, TIMEOUT_S)


def only_finding(*rank_states):
    found = assess(*rank_states)
    assert found.verdict == "deadlock", found
    [finding] = found.findings
    return worded(finding)


def two(inflight0, inflight1, recent0=(), recent1=()):
    return (rank_state(0, 2, inflight=inflight0, recent=recent0), rank_state(1, 2, inflight=inflight1, recent=recent1))


def test_two_ranks_each_sending_to_the_other_are_a_send_first_cycle_of_both():
    finding = only_finding(*two([p2p(0, "send", 1)], [p2p(0, "send", 0)]))
    assert (finding["kind"], finding["ranks"]) == ("p2p_deadlock", [0, 1])
    assert finding["evidence"]["shape"] == "send_first"
    assert [step["rank"] for step in finding["evidence"]["cycle"]] == [0, 1]
    assert finding["location"]["line"] == 12
    assert "irecv" in finding["fix"] and "batch_isend_irecv" in finding["fix"] and "parity" in finding["fix"]
    assert "send to rank 1 at halo.py:12" in finding["summary"]


def test_a_ring_of_three_sends_is_one_cycle_through_every_rank():
    ring = [rank_state(r, 3, inflight=[p2p(0, "send", (r + 1) % 3)]) for r in range(3)]
    finding = only_finding(*ring)
    assert finding["evidence"]["shape"] == "send_first"
    assert [s["rank"] for s in finding["evidence"]["cycle"]] == [0, 1, 2]
    assert [s["waits_for"] for s in finding["evidence"]["cycle"]] == [1, 2, 0]


def test_irecvs_waited_before_either_side_sends_are_a_recv_first_cycle():
    finding = only_finding(
        *two([p2p(0, "recv", 1, api="irecv", waited=True)], [p2p(0, "recv", 0, api="irecv", waited=True)])
    )
    assert finding["evidence"]["shape"] == "recv_first"
    assert "send first" in finding["fix"]


def test_a_send_and_a_recv_with_different_tags_name_both_ranks_and_the_recv_line():
    finding = only_finding(
        *two([p2p(0, "send", 1, tag=7, site=("x.py", 5, "f"))], [p2p(0, "recv", 0, tag=8, site=("x.py", 9, "f"))])
    )
    assert finding["evidence"]["shape"] == "unmatched"
    assert finding["ranks"] == [0, 1]
    assert finding["location"]["line"] == 9
    assert "tag 7" in finding["fix"]
    assert "rank condition" not in finding["summary"]


def test_a_recv_from_the_wrong_source_is_the_pair_that_does_not_match():
    ranks = [
        rank_state(0, 3, inflight=[p2p(0, "send", 1, site=("x.py", 5, "f"))]),
        rank_state(1, 3, inflight=[p2p(0, "recv", 2, site=("x.py", 7, "f"))]),
        rank_state(2, 3, inflight=[rec(0, "barrier", site=("x.py", 9, "f"))]),
    ]
    finding = only_finding(*ranks)
    assert finding["evidence"]["shape"] == "unmatched"
    assert finding["ranks"] == [0, 1]
    assert finding["location"]["line"] == 7


def test_a_stage_sending_one_microbatch_more_than_its_peer_receives_names_both_sides_with_their_counts():
    """Which side's count is wrong is the program's to say: both stages are named, with both counts."""
    stage0, stage1 = two(
        [p2p(3, "send", 1, site=("pipe.py", 20, "stage"))], [rec(0, "all_reduce", site=("pipe.py", 30, "stage"))]
    )
    stage0["p2p_counts"], stage1["p2p_counts"] = {"0:send:1": 4}, {"0:recv:0": 3}
    finding = only_finding(stage0, stage1)
    assert (finding["evidence"]["shape"], finding["ranks"]) == ("into_collective", [0, 1])
    assert finding["location"]["line"] == 20
    assert "send #4 to rank 1 at pipe.py:20; rank 1 has received 3 from it" in finding["summary"]
    assert "Rank 1 went on to a collective without the matching receive" in finding["summary"]
    assert "microbatches" in finding["fix"]


def test_an_isend_waited_on_is_located_where_it_waits_and_said_where_it_was_issued():
    waiting = rank_state(
        0,
        2,
        inflight=[p2p(0, "send", 1, api="isend", waited=True, site=("x.py", 5, "f"))],
        stacks=[F.main_stack(("x.py", 1, "main"), ("x.py", 9, "f"), (F.TORCH_FILE, 10, "wait", True))],
    )
    other = rank_state(1, 2, inflight=[p2p(0, "send", 0, api="isend", waited=True, site=("x.py", 5, "f"))])
    finding = only_finding(waiting, other)
    assert finding["location"]["line"] == 9
    assert "issued at x.py:5, waited on at x.py:9" in finding["summary"]


def test_batch_isend_irecv_ops_are_matched_one_by_one():
    batch = p2p(0, "batch_p2p", -2, api="batch_isend_irecv", waited=True, ops=[("send", 1, 0), ("recv", 1, 0)])
    finding = only_finding(*two([batch], [rec(0, "barrier", site=("x.py", 9, "f"))]))
    assert (finding["kind"], finding["ranks"], finding["evidence"]["shape"]) == (
        "p2p_deadlock",
        [0, 1],
        "into_collective",
    )
    assert "batch_isend_irecv (send to rank 1, recv from rank 1)" in finding["evidence"]["mismatched"][0]["description"]
    assert "lists must pair" in finding["fix"]


# ---------------------------------------------------------------- not proven: it can still move, or it is not a wait


def test_a_matching_send_and_recv_both_in_flight_are_a_slow_transfer_not_a_deadlock():
    assert assess(*two([p2p(0, "send", 1)], [p2p(0, "recv", 0)])).verdict is None


def test_a_recv_from_any_source_matches_a_send_to_it():
    assert assess(*two([p2p(0, "send", 1)], [p2p(0, "recv", -1)])).verdict is None


def test_an_unknown_tag_matches_any_tag():
    assert assess(*two([p2p(0, "send", 1, tag=None)], [p2p(0, "recv", 0, tag=5)])).verdict is None


def test_an_irecv_in_flight_while_the_rank_computes_is_no_wait():
    """Rank 0 posted an irecv and computes; rank 1 waits in a barrier rank 0 will reach: benign (prefetching)."""
    found = assess(*two([p2p(0, "recv", 1, api="irecv", waited=False)], [rec(0, "barrier")]))
    assert found.verdict is None and found.findings == []


def test_the_same_irecv_waited_on_is_a_proven_deadlock():
    finding = only_finding(*two([p2p(0, "recv", 1, api="irecv", waited=True)], [rec(0, "barrier")]))
    assert (finding["kind"], finding["evidence"]["shape"]) == ("p2p_deadlock", "into_collective")


def test_a_rank_still_making_progress_is_never_part_of_a_proof():
    busy = rank_state(1, 2, inflight=[p2p(0, "send", 0)], idle=0.1)
    assert assess(rank_state(0, 2, inflight=[p2p(0, "send", 1)]), busy).verdict is None


@pytest.mark.parametrize("build", [F.trace_lone_barrier, F.trace_groups_in_opposite_orders, F.trace_empty_tensor])
def test_collectives_alone_are_left_to_the_collective_passes(build):
    from ddpwatch.analysis.p2p import p2p_deadlock

    trace = build()
    waiting = {r: analysis.waiting_record(s) for r, s in trace.states.items()}
    assert p2p_deadlock(waiting, trace.states, trace.world_size) is None
