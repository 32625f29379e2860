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


# ---------------------------------------------------------------- the rank that went on without its send (issue 42)

REPORT_SOURCE = """import torch.distributed as dist


def report_errors(errors, rank):
    if not errors:
        return
    dist.send(torch.tensor([len(errors)]), dst=0)


def collect(world_size):
    for source in range(1, world_size):
        count = torch.zeros(1)
        dist.recv(count, src=source)
"""
SEND_LINE, RETURN_LINE, RECV_LINE = 7, 6, 13


def error_report_states(ranks_sent=(1,), counts_full=False):
    """Rank 0 receives from every rank in turn and waits for rank 2's count; ranks 1 and 2 stand in the barrier
    after it. Ranks in `ranks_sent` sent their count (at report_errors' send); rank 2 sent nothing."""
    code = F.code_of(REPORT_SOURCE, [SEND_LINE, RECV_LINE])
    site = ("train.py", SEND_LINE, "report_errors")
    sent = {r: [p2p(0, "send", 0, site=site, state="completed")] for r in ranks_sent}
    received = [p2p(0, "recv", r, site=("train.py", RECV_LINE, "collect"), state="completed") for r in ranks_sent]
    ranks = [rank_state(0, 3, inflight=[p2p(0, "recv", 2, site=("train.py", RECV_LINE, "collect"))], recent=received)]
    for r in (1, 2):
        barrier = rec(0, "barrier", site=("train.py", 20, "main"))
        ranks.append(rank_state(r, 3, inflight=[barrier], recent=sent.get(r, [])))
    for state in ranks:
        state["code"] = code
    ranks[0]["p2p_counts"] = {"0:recv:1": 1, "0:recv:2": 1}
    ranks[1]["p2p_counts"] = {"0:send:0": 1}
    ranks[2]["p2p_counts"] = {f"0:send:{9 + n}": 1 for n in range(64)} if counts_full else {}
    return ranks


def test_a_rank_whose_helper_returns_before_its_send_is_the_culprit_at_that_return():
    finding = only_finding(*error_report_states())
    assert (finding["kind"], finding["evidence"]["shape"], finding["ranks"]) == ("p2p_deadlock", "into_collective", [2])
    assert finding["location"]["line"] == RETURN_LINE
    [gone] = finding["evidence"]["went_on"]
    assert (gone["rank"], gone["peer"], gone["half"], gone["count"], gone["peer_count"]) == (2, 0, "send", 0, 1)
    assert gone["exit"]["half_site"]["line"] == SEND_LINE and gone["exit"]["half_of"] == 1
    assert "Rank 2 went on to a collective without the send rank 0 waits for" in finding["summary"]
    assert "(observed in the run)" in finding["summary"] and "read from the source" in finding["summary"]
    assert "send on every path" in finding["fix"] and "all_gather_object" in finding["fix"]


def test_without_an_exit_before_the_send_in_the_source_both_ends_stay_named():
    ranks = error_report_states()
    for state in ranks:
        state["code"] = F.code_of(REPORT_SOURCE.replace("return", "pass"), [SEND_LINE, RECV_LINE])
    finding = only_finding(*ranks)
    assert finding["ranks"] == [0, 2] and "went_on" not in finding["evidence"]


def test_without_counts_that_say_who_sent_fewer_both_ends_stay_named():
    """Rank 2's table of pairs is full: a pair it does not name is not known to be zero."""
    finding = only_finding(*error_report_states(counts_full=True))
    assert finding["ranks"] == [0, 2] and "went_on" not in finding["evidence"]


def test_an_exit_under_a_rank_condition_is_the_programs_shape_not_a_way_past_the_send():
    ranks = error_report_states()
    source = REPORT_SOURCE.replace("if not errors:", "if rank == 2:")
    for state in ranks:
        state["code"] = F.code_of(source, [SEND_LINE, RECV_LINE])
    finding = only_finding(*ranks)
    assert finding["ranks"] == [0, 2] and "went_on" not in finding["evidence"]
