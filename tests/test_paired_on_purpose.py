"""What torch and correct code pair on purpose is compared for what it is (issue 40), and only a fact may end a job:
rotating roots, data-free barriers, torch's Join, sizes each rank chooses, reduce ops without a stable name (no
processes: hand-built fingerprints and states, a live Recorder)."""

import sys

import pytest
import torch.distributed as dist

import factory as F
from ddpwatch import analysis
from ddpwatch.analysis import incident, silent
from ddpwatch.capture.record import Recorder
from ddpwatch.config import ABORT, REPORT, Config
from ddpwatch.format import build
from ddpwatch.render import wording
from ddpwatch.render.text import render_text
from ddpwatch.watch.abort import AbortPolicy
from ddpwatch.watch.mailbox import Mailbox
from ddpwatch.watch.fingerprints import FingerprintLog, _reduce_name

A, B = ("stats.py", 10, "share"), ("stats.py", 12, "share")


def compare(per_rank: dict) -> list:
    docs = {rank: F.fingerprints(rank, sigs) for rank, sigs in per_rank.items()}
    return silent.silent_mismatch(docs, len(docs)) + silent.crossed_collectives(docs, len(docs))


def bcast(site, root):
    return F.signature(op="broadcast", reduce=None, site=site, root=root)


# ---------------------------------------------------------------- an op overlapped with computation


def _overlapped(waited: bool) -> dict:
    """Rank 0 issued an all_reduce on group A with async_op=True and computes (then it will call a barrier on group
    B, then wait on the all_reduce); rank 1 waits in B's barrier and will then join A's all_reduce: correct, seen
    while rank 0 computes (tests/scenarios/hangs.py `async_overlap`). `waited`: rank 0 is inside work.wait() instead,
    before B's barrier: a real crossing."""
    groups = {"0": None, "A": [0, 1], "B": [0, 1]}
    held = dict(F.rec(5, "all_reduce", group="A", site=("train.py", 50, "step")), **{"async": True, "waited": waited})
    barrier = F.rec(7, "barrier", group="B", age=2.5, site=("train.py", 60, "step"))
    rank1 = F.rank_state(1, 2, inflight=[barrier], idle=2.5, groups=groups)
    return F.states(F.rank_state(0, 2, inflight=[held], groups=groups), rank1)


def test_an_op_overlapped_with_computation_then_a_call_on_another_group_is_no_crossing():
    assert analysis.assess(_overlapped(waited=False), 2, 0.5, 300.0).verdict is None  # before: group_order, a fact
    crossed = analysis.assess(_overlapped(waited=True), 2, 0.5, 300.0)
    assert crossed.verdict == analysis.DEADLOCK and [f["kind"] for f in crossed.findings] == ["group_order"]


def test_a_rank_is_read_at_the_call_it_waits_in_not_at_an_older_op_it_holds():
    """Rank 0 holds an older all_reduce it never waited on and waits inside a barrier on B; rank 1 waits in a barrier
    on C: a real crossing of B and C. Read at its oldest op, rank 0 would stand on A and nothing would be proven."""
    groups = {"0": None, "A": [0, 1], "B": [0, 1], "C": [0, 1]}
    held = dict(F.rec(5, "all_reduce", group="A", age=5.0), **{"async": True, "waited": False})
    inside = F.rec(3, "barrier", group="B", age=3.0)
    states = F.states(
        F.rank_state(0, 2, inflight=[held, inside], groups=groups),
        F.rank_state(1, 2, inflight=[F.rec(4, "barrier", group="C", age=3.0)], groups=groups),
    )
    assert analysis.waiting_record(states[0]) is inside
    crossed = analysis.assess(states, 2, 0.5, 300.0)
    assert crossed.verdict == analysis.DEADLOCK and [f["kind"] for f in crossed.findings] == ["group_order"]


# ---------------------------------------------------------------- roles that rotate, calls without data


def test_a_broadcast_whose_root_rotates_is_not_crossed_on_two_or_three_ranks():
    """`if rank == src: broadcast(mine, src) else: broadcast(buf, src)` for src in range(world): the root's line is
    A, the others' B; each rank issues A in its own turn."""
    two = {0: [bcast(A, 0), bcast(B, 1)], 1: [bcast(B, 0), bcast(A, 1)]}
    three = {0: [bcast(A, 0), bcast(B, 1), bcast(B, 2)], 1: [bcast(B, 0), bcast(A, 1), bcast(B, 2)]}
    three[2] = [bcast(B, 0), bcast(B, 1), bcast(A, 2)]
    assert compare(two) == [] and compare(three) == []


def test_broadcasts_of_one_root_issued_in_another_order_are_still_crossed():
    """The same root at both positions: the helpers broadcasting x and y ran in a rank-dependent order."""
    [found] = compare({0: [bcast(A, 0), bcast(B, 0)], 1: [bcast(B, 0), bcast(A, 0)]})
    assert found["kind"] == "crossed_collectives"


def test_a_rooted_call_whose_root_was_not_kept_is_never_crossed():
    """The flight recorder keeps no root: a rotating root cannot be told from a crossing, so nothing is said."""
    assert compare({0: [bcast(A, None), bcast(B, None)], 1: [bcast(B, None), bcast(A, None)]}) == []


def test_ranks_at_one_position_with_different_roots_differ_in_root():
    [found] = compare({0: [bcast(A, 0)], 1: [bcast(A, 1)]})
    assert found["kind"] == "silent_mismatch" and found["facts"]["differs"] == ["root"]


def test_turn_taking_barriers_from_two_lines_are_not_crossed():
    barrier = lambda site: F.signature(op="barrier", reduce=None, dtypes=(), counts=(), site=site)  # noqa: E731
    assert compare({0: [barrier(A), barrier(B)], 1: [barrier(B), barrier(A)]}) == []


# ---------------------------------------------------------------- torch's Join


def test_positions_inside_torchs_join_are_not_compared():
    """A joined rank's MAX of int64 (DDP's _find_common_rank) meets another's SUM of float32: torch's design."""
    joined = F.signature(reduce="max", dtypes=("int64",), counts=(1,), region=build.TORCH_JOIN)
    training = F.signature(reduce="sum", dtypes=("float32",), counts=(1,))
    assert compare({0: [joined], 1: [training]}) == []


def test_past_a_ranks_unaligned_mark_its_positions_are_not_compared():
    docs = {0: F.fingerprints(0, [F.signature(), F.signature()]), 1: F.fingerprints(1, [F.signature()] * 2)}
    docs[1]["signatures"]["1"] = F.signature(reduce="max")
    [found] = silent.silent_mismatch(docs, 2)
    assert found["facts"]["seq"] == 1
    docs[0]["groups"]["0"]["unaligned_from"] = 1  # rank 0 entered torch's Join at position 1
    assert silent.silent_mismatch(docs, 2) == []


def _complete(recorder, op="all_reduce", region=None, api=None):
    record = recorder.begin(op, api or op, "0", (((1,), "torch.float32"),), sys._getframe())
    record.region = region
    recorder.finish(record)


def test_the_python_recorders_log_marks_a_group_unaligned_from_its_first_join_position():
    recorder = Recorder()
    log = FingerprintLog(recorder)
    _complete(recorder)
    _complete(recorder, region=(build.TORCH_JOIN, None, "Join.__exit__", None))
    _complete(recorder)
    log.collect()
    assert log.document()["groups"]["0"]["unaligned_from"] == 1
    flight = FingerprintLog(recorder, numbered_by_torch=True)  # torch's own numbering: still aligned
    flight.collect()
    assert "unaligned_from" not in flight.document()["groups"]["0"]


# ---------------------------------------------------------------- sizes each rank chooses


def test_an_uneven_all_to_all_long_in_flight_on_every_rank_is_no_proven_mismatch():
    """A large all_to_all_single with per-rank splits, blocked past the grace on both ranks (a slow transfer)."""
    a2a = lambda shape: F.rec(5, "all_to_all", api="all_to_all_single", shapes=[shape], age=5.0)  # noqa: E731
    states = F.states(F.rank_state(0, 2, inflight=[a2a([6])]), F.rank_state(1, 2, inflight=[a2a([9])]))
    assert analysis.assess(states, 2, 0.5, 300.0).verdict is None


def test_a_list_all_gather_of_uneven_sizes_long_in_flight_is_no_proven_mismatch():
    gather = lambda shape: F.rec(5, "all_gather", api="all_gather", shapes=[shape], age=5.0)  # noqa: E731
    states = F.states(F.rank_state(0, 2, inflight=[gather([3])]), F.rank_state(1, 2, inflight=[gather([4])]))
    assert analysis.assess(states, 2, 0.5, 300.0).verdict is None


def test_an_all_reduce_of_different_sizes_long_in_flight_is_still_a_shape_mismatch():
    reduce_ = lambda shape: F.rec(5, "all_reduce", shapes=[shape], age=5.0)  # noqa: E731
    states = F.states(F.rank_state(0, 2, inflight=[reduce_([3])]), F.rank_state(1, 2, inflight=[reduce_([4])]))
    assessment = analysis.assess(states, 2, 0.5, 300.0)
    assert assessment.verdict == analysis.DEADLOCK and assessment.findings[0]["kind"] == "shape_mismatch"


@pytest.mark.parametrize("api", ["all_gather", "reduce_scatter", "all_to_all_single"])
def test_completed_calls_whose_sizes_are_each_ranks_own_publish_no_counts(api):
    recorder = Recorder()
    log = FingerprintLog(recorder)
    _complete(recorder, op=api.replace("_single", ""), api=api)
    log.collect()
    assert log.document()["signatures"]["0"]["counts"] == []


# ---------------------------------------------------------------- reduce ops without a stable str()


def test_reduce_ops_are_named_by_their_type_not_their_address():
    premul = [dist._make_nccl_premul_sum(0.5), dist._make_nccl_premul_sum(0.5)]
    assert [_reduce_name(op) for op in premul] == ["premul_sum", "premul_sum"]
    assert _reduce_name(dist.ReduceOp(dist.ReduceOp.MAX)) == "max" and _reduce_name(dist.ReduceOp.SUM) == "sum"
    assert _reduce_name(object()) is None  # no name to compare: not compared


# ---------------------------------------------------------------- only a fact acts


@pytest.mark.parametrize(
    "stage", [s for s in analysis.STAGES if s.proves], ids=lambda s: s.name if hasattr(s, "name") else str(s)
)
def test_under_abort_every_stage_that_proves_a_fact_ends_the_job(stage):
    policy = AbortPolicy(Config(action=ABORT), 0, 2, None, Mailbox(None), set())
    assert policy.action_for(stage.verdict) == ABORT


def test_under_abort_a_completed_mismatch_and_a_dump_are_reported_only():
    policy = AbortPolicy(Config(action=ABORT), 0, 2, None, Mailbox(None), set())
    assert [s.name for s in analysis.STAGES if not s.proves] == ["completed"]
    assert policy.action_for(analysis.MISMATCH) == REPORT and policy.action_for(analysis.DUMP) == REPORT


def test_every_kind_has_a_status_and_only_readings_never_act():
    assert set(analysis.KIND_STATUS) == set(analysis.FINDING_KINDS)
    proven = analysis.STAGE_MISMATCH
    for kind, status in analysis.KIND_STATUS.items():
        basis = analysis.table.basis(proven, kind)
        assert basis["acts"] is (status != "reading"), kind
        assert analysis.table.basis(analysis.STAGE_COMPLETED, kind)["acts"] is False


def test_a_report_says_which_part_is_a_fact_and_which_a_reading():
    trace = F.trace_completed({0: [F.signature()], 1: [F.signature(dtypes=("int32",))]})
    built = incident.build(trace.states, trace.world_size, 0.5, 300.0)
    assert built["trigger"] == analysis.MISMATCH
    [finding] = wording.worded_incident(built)["findings"]
    assert finding["basis"]["status"] == "reading" and not analysis.findings_act(built["findings"])
    assert "A reading, not a proof" in render_text(built)
    seed = F.seed_states()
    built = incident.build(seed, 2, 0.5, 300.0)
    [finding] = wording.worded_incident(built)["findings"]
    assert finding["kind"] == "ddp_forward_on_subset" and finding["basis"]["status"] == "explained"
    assert "every live rank is blocked" in finding["basis"]["says"] and analysis.findings_act(built["findings"])
    text = " ".join(render_text(built).split())
    assert "Fact: every live rank is blocked" in text and "Reading: which rank is the culprit" in text
