"""assess() and its helpers on hand-built traces: which rank, which line, which kind. No torch."""

import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import (
    SEED_SEQ,
    barrier,
    ddp_broadcast,
    ddp_region,
    done,
    object_region,
    rank_state,  # noqa: E402
    rec,
    seed_states,
    states,
)

import factory as F  # noqa: E402
from ddpwatch import analysis  # noqa: E402
from ddpwatch.format import build, documents  # noqa: E402
from ddpwatch.analysis import DEADLOCK, TIMEOUT, assess, fingerprint  # noqa: E402
from ddpwatch.render.positions import groups_by_position  # noqa: E402
from ddpwatch.render.wording import describe_op, rank_list, worded  # noqa: E402

GRACE = 2.0
TIMEOUT_S = 300.0
FINDING_KEYS = {"kind", "ranks", "summary", "fix", "location", "evidence", "facts", "basis"}  # as report.json holds one
DATA_KEYS = {"kind", "ranks", "location", "evidence", "facts", "basis"}  # as the analysis hands it over: no words


def run(st, world_size=None):
    return assess(st, len(st) if world_size is None else world_size, GRACE, TIMEOUT_S)


def only(assessment):
    assert len(assessment.findings) == 1, assessment.findings
    return worded(assessment.findings[0])  # with its summary and fix, as report.json has it


def loc(file, line, function):
    return {"file": "/u/" + file, "line": line, "function": function}


def rows(finding):
    """The side-by-side evidence as {tuple(ranks): op}."""
    return {tuple(row["ranks"]): row["op"] for row in finding["evidence"]["mismatched"]}


# ---------------------------------------------------------------- the seed stall: DDP forward on one rank


def test_seed_stall_two_ranks_blames_rank0_at_the_ddp_call_site():
    a = run(seed_states(2))
    assert a.verdict == DEADLOCK
    f = only(a)
    assert f["kind"] == "ddp_forward_on_subset"
    assert f["ranks"] == [0]
    # The user's line that called the DDP model, not the record's own (torch-internal) site.
    assert f["location"] == loc("val.py", 42, "validate")
    assert "model.module(" in f["fix"]
    assert "val.py:42" in f["fix"]
    assert f["evidence"]["ddp_op"] == "buffer_broadcast"
    assert rows(f) == {(0,): "broadcast", (1,): "barrier"}
    assert f["summary"].startswith("Rank 0 called the DistributedDataParallel model at val.py:42")
    assert "rank 1 waits in barrier at train.py:88" in f["summary"]
    assert len(a.fingerprint) == 16


@pytest.mark.parametrize("world_size", [3, 8])
def test_seed_stall_many_ranks_names_only_the_ddp_caller(world_size):
    f = only(run(seed_states(world_size)))
    assert f["kind"] == "ddp_forward_on_subset"
    assert f["ranks"] == [0]  # the ranks waiting at the barrier are never the culprit
    assert f["location"]["line"] == 42
    assert rows(f) == {(0,): "broadcast", tuple(range(1, world_size)): "barrier"}
    assert f"ranks 1-{world_size - 1} wait in barrier at train.py:88" in f["summary"]


def test_seed_stall_with_the_ddp_caller_not_rank0():
    """Rank 2 runs the validation; nothing may assume the culprit is rank 0 (or is not rank 0)."""
    st = states(
        rank_state(0, 3, inflight=[barrier()]),
        rank_state(1, 3, inflight=[barrier()]),
        rank_state(2, 3, inflight=[ddp_broadcast()]),
    )
    f = only(run(st))
    assert f["kind"] == "ddp_forward_on_subset"
    assert f["ranks"] == [2]


def test_bucket_rebuild_variant():
    a = run(seed_states(2, api=build.DDP_BUCKET_REBUILD))
    assert a.verdict == DEADLOCK
    f = only(a)
    assert f["kind"] == "ddp_forward_on_subset"
    assert f["ranks"] == [0]
    assert f["evidence"]["ddp_op"] == "bucket_rebuild"
    assert "rebuild" in f["fix"]
    assert "bucket" in f["fix"]
    assert f["location"] == loc("val.py", 42, "validate")


# ---------------------------------------------------------------- plain collectives on a subset of ranks


def test_collective_on_subset_barrier_rule():
    st = states(
        rank_state(0, 2, inflight=[rec(4, "all_reduce", site=("x.py", 10, "f"))]),
        rank_state(1, 2, inflight=[rec(4, "barrier", site=("x.py", 20, "f"))]),
    )
    a = run(st)
    assert a.verdict == DEADLOCK
    f = only(a)
    assert f["kind"] == "collective_on_subset"
    assert f["ranks"] == [0]
    assert f["location"] == loc("x.py", 10, "f")
    assert f["evidence"]["culprit_rule"] == "barrier"
    assert "x.py:10" in f["fix"]


def test_collective_on_subset_barrier_rule_culprit_is_rank1():
    st = states(
        rank_state(0, 2, inflight=[rec(4, "barrier", site=("x.py", 20, "f"))]),
        rank_state(1, 2, inflight=[rec(4, "all_reduce", site=("x.py", 10, "f"))]),
    )
    f = only(run(st))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("collective_on_subset", [1], 10)


def test_collective_on_subset_barrier_rule_two_against_two():
    ar = lambda: rec(4, "all_reduce", site=("x.py", 10, "f"))  # noqa: E731
    br = lambda: rec(4, "barrier", site=("x.py", 20, "f"))  # noqa: E731
    st = states(
        rank_state(0, 4, inflight=[ar()]),
        rank_state(1, 4, inflight=[br()]),
        rank_state(2, 4, inflight=[ar()]),
        rank_state(3, 4, inflight=[br()]),
    )
    f = only(run(st))
    assert f["kind"] == "collective_on_subset"
    assert f["ranks"] == [0, 2]
    assert f["evidence"]["culprit_rule"] == "barrier"


@pytest.mark.parametrize("culprit", [0, 1, 2])
def test_collective_on_subset_majority_rule(culprit):
    st = states(
        *[
            rank_state(
                r,
                3,
                inflight=[rec(7, "broadcast", site=("y.py", 50, "g"))]
                if r == culprit
                else [rec(7, "all_reduce", site=("y.py", 30, "g"))],
            )
            for r in range(3)
        ]
    )
    a = run(st)
    assert a.verdict == DEADLOCK
    f = only(a)
    assert f["kind"] == "collective_on_subset"
    assert f["ranks"] == [culprit]
    assert f["location"] == loc("y.py", 50, "g")
    assert f["evidence"]["culprit_rule"] == "majority"


def test_majority_with_three_partitions_names_both_minorities():
    calls = {
        0: ("all_reduce", 30),
        1: ("broadcast", 50),
        2: ("all_reduce", 30),
        3: ("all_gather", 60),
        4: ("all_reduce", 30),
    }
    st = states(*[rank_state(r, 5, inflight=[rec(7, op, site=("y.py", line, "g"))]) for r, (op, line) in calls.items()])
    f = only(run(st))
    assert f["kind"] == "collective_on_subset"
    assert f["ranks"] == [1, 3]
    assert f["evidence"]["culprit_rule"] == "majority"


def test_collective_mismatch_without_a_tie_breaker():
    st = states(
        rank_state(0, 2, inflight=[rec(4, "all_reduce", site=("x.py", 10, "f"))]),
        rank_state(1, 2, inflight=[rec(4, "broadcast", site=("x.py", 20, "f"))]),
    )
    a = run(st)
    assert a.verdict == DEADLOCK
    f = only(a)
    assert f["kind"] == "collective_mismatch"
    assert f["ranks"] == [0, 1]
    assert f["evidence"]["culprit_rule"] == "none"
    assert rows(f) == {(0,): "all_reduce", (1,): "broadcast"}


def test_collective_mismatch_when_both_lines_are_familiar():
    history = [done(1, "all_reduce", site=("x.py", 10, "f")), done(2, "broadcast", site=("x.py", 20, "f"))]
    st = states(
        rank_state(0, 2, inflight=[rec(4, "all_reduce", site=("x.py", 10, "f"))], recent=history),
        rank_state(1, 2, inflight=[rec(4, "broadcast", site=("x.py", 20, "f"))], recent=history),
    )
    f = only(run(st))
    assert f["kind"] == "collective_mismatch"


def test_history_rule():
    history = [done(1, "all_gather", site=("b.py", 9, "h")), done(2, "all_gather", site=("b.py", 9, "h"))]
    st = states(
        rank_state(0, 2, inflight=[rec(3, "all_reduce", site=("a.py", 5, "h"))], recent=history),
        rank_state(1, 2, inflight=[rec(3, "all_gather", site=("b.py", 9, "h"))], recent=history),
    )
    a = run(st)
    assert a.verdict == DEADLOCK
    f = only(a)
    assert f["kind"] == "collective_on_subset"
    assert f["ranks"] == [0]
    assert f["location"] == loc("a.py", 5, "h")
    assert f["evidence"]["culprit_rule"] == "history"


def test_history_rule_needs_every_rank_to_have_seen_the_line():
    """Only rank 1 has been at b.py:9 before: no rule applies, so no culprit is named."""
    st = states(
        rank_state(0, 2, inflight=[rec(3, "all_reduce", site=("a.py", 5, "h"))]),
        rank_state(
            1,
            2,
            inflight=[rec(3, "all_gather", site=("b.py", 9, "h"))],
            recent=[done(2, "all_gather", site=("b.py", 9, "h"))],
        ),
    )
    assert only(run(st))["kind"] == "collective_mismatch"


def test_collectives_on_two_groups_give_one_finding_each():
    st = states(
        rank_state(
            0,
            2,
            inflight=[
                rec(4, "all_reduce", site=("x.py", 10, "f")),
                rec(2, "broadcast", group="1", site=("z.py", 3, "f"), age=2.5),
            ],
        ),
        rank_state(1, 2, inflight=[rec(4, "barrier", site=("x.py", 20, "f"))]),
    )
    # waiting_record() picks the oldest collective, so only group 0 is compared.
    f = only(run(st))
    assert (f["kind"], f["ranks"]) == ("collective_on_subset", [0])


# ---------------------------------------------------------------- no verdict while anyone may still move


@pytest.mark.parametrize("busy", ["no_inflight", "young_op", "recent_progress"])
def test_no_deadlock_while_a_rank_is_busy(busy):
    if busy == "no_inflight":
        rank1 = rank_state(1, 2, inflight=[], idle=50.0, user_line=("train.py", 60, "train"))
    elif busy == "young_op":
        rank1 = rank_state(1, 2, inflight=[barrier(age=GRACE / 4)], idle=GRACE / 4)
    else:
        rank1 = rank_state(1, 2, inflight=[barrier(age=10.0)], idle=GRACE / 4)
    st = states(seed_states(2)[0], rank1)
    a = run(st)
    assert a.verdict is None
    assert a.findings == []


def test_straggler_after_the_timeout():
    st = states(
        rank_state(0, 2, inflight=[], idle=400.0, user_line=("val.py", 40, "validate")),
        rank_state(1, 2, inflight=[barrier(age=TIMEOUT_S + 1)], idle=TIMEOUT_S + 1),
    )
    a = run(st)
    assert a.verdict == TIMEOUT
    f = only(a)
    assert f["kind"] == "straggler"
    assert f["ranks"] == [0]
    assert f["location"] == loc("val.py", 40, "validate")
    assert f["evidence"]["waiting"] == [1]
    assert f["evidence"]["busy_at"] == {"0": loc("val.py", 40, "validate")}
    assert a.fingerprint


def test_straggler_exactly_at_the_timeout():
    st = states(
        rank_state(0, 2, inflight=[], idle=400.0, user_line=("val.py", 40, "validate")),
        rank_state(1, 2, inflight=[barrier(age=TIMEOUT_S)], idle=TIMEOUT_S),
    )
    assert run(st).verdict == TIMEOUT


def test_no_straggler_before_the_timeout():
    st = states(
        rank_state(0, 2, inflight=[], idle=400.0, user_line=("val.py", 40, "validate")),
        rank_state(1, 2, inflight=[barrier(age=TIMEOUT_S - 1)], idle=TIMEOUT_S - 1),
    )
    a = run(st)
    assert a.verdict is None
    assert a.findings == []


def test_straggler_among_many_ranks_names_the_busy_one():
    st = states(
        *[rank_state(r, 4, inflight=[barrier(age=500.0)], idle=500.0) for r in (0, 1, 3)],
        rank_state(2, 4, inflight=[], idle=500.0, user_line=("ckpt.py", 12, "save")),
    )
    f = only(run(st))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("straggler", [2], 12)
    assert f["evidence"]["waiting"] == [0, 1, 3]


def test_matching_waits_are_not_a_deadlock():
    """Every rank in the same op at the same seq: the calls match; nothing is proven (it may just be slow)."""
    st = states(*[rank_state(r, 3, inflight=[barrier()]) for r in range(3)])
    assert run(st).verdict is None
    st = states(
        *[
            rank_state(r, 3, inflight=[rec(5, "all_reduce", site=("x.py", 10, "f"), age=30.0)], idle=30.0)
            for r in range(3)
        ]
    )
    assert run(st).verdict is None


def test_matching_waits_from_different_lines_are_not_a_deadlock():
    """Same seq, op and api reached from different lines still pair up in c10d."""
    st = states(
        rank_state(0, 2, inflight=[barrier(where=("val.py", 50, "v"))]),
        rank_state(1, 2, inflight=[barrier(where=("train.py", 88, "t"))]),
    )
    assert run(st).verdict is None


def test_missing_rank_means_no_verdict():
    st = seed_states(3)
    del st[2]
    a = assess(st, 3, GRACE, TIMEOUT_S)
    assert a.verdict is None
    assert a.findings == []


def test_exited_rank_is_not_part_of_a_deadlock():
    st = seed_states(3)
    st[2] = rank_state(2, 3, status=build.EXITED)
    f = only(run(st))
    assert (f["kind"], f["ranks"]) == ("ddp_forward_on_subset", [0])


# ---------------------------------------------------------------- fingerprint


def test_fingerprint_is_stable_and_ignores_the_passing_of_time():
    st = seed_states(3)
    assert fingerprint(st) == fingerprint(copy.deepcopy(st)) == run(st).fingerprint
    older = seed_states(3, age=9.0, idle=9.0)  # the same positions, seconds later
    assert fingerprint(older) == fingerprint(st)


def test_fingerprint_changes_with_the_position():
    st = seed_states(2)
    moved = copy.deepcopy(st)
    moved[1]["inflight"][0]["seq"] = SEED_SEQ + 1
    assert fingerprint(moved) != fingerprint(st)
    other_api = copy.deepcopy(st)
    other_api[0]["inflight"][0]["api"] = build.DDP_BUCKET_REBUILD
    assert fingerprint(other_api) != fingerprint(st)
    other_group = copy.deepcopy(st)
    other_group[1]["inflight"][0]["group"] = "1"
    assert fingerprint(other_group) != fingerprint(st)


# ---------------------------------------------------------------- positions and rank lists


def test_positions_at_1024_ranks():
    st = seed_states(1024)
    groups = groups_by_position(st, GRACE)
    assert len(groups) == 2
    assert groups[0]["ranks"] == list(range(1, 1024))
    assert groups[0]["state"] == "waiting"
    assert groups[0]["where"] == "barrier at train.py:88"
    assert rank_list(groups[0]["ranks"]) == "ranks 1-1023"
    assert groups[1]["ranks"] == [0]
    assert groups[1]["where"] == (
        "broadcast of module buffers inside DistributedDataParallel.forward called at val.py:42"
    )
    assert groups[1]["wait_s"] == 3.0


def test_positions_busy_and_exited():
    st = states(
        rank_state(0, 3, inflight=[barrier()]),
        rank_state(1, 3, inflight=[barrier(age=GRACE / 2)], user_line=("a.py", 1, "f")),
        rank_state(2, 3, status=build.EXITED),
    )
    groups = {tuple(g["ranks"]): g for g in groups_by_position(st, GRACE)}
    assert set(groups) == {(0,), (1,), (2,)}
    assert groups[(0,)]["state"] == "waiting"
    assert groups[(1,)]["state"] == "busy"
    assert groups[(1,)]["where"] == "busy outside collectives at train.py:88"  # the main thread's innermost user frame
    assert groups[(2,)]["state"] == "exited"


@pytest.mark.parametrize(
    "ranks, text",
    [
        ([0, 1, 2, 5], "ranks 0-2,5"),
        ([3], "rank 3"),
        ([5, 1, 0, 2, 2], "ranks 0-2,5"),
        ([0, 2, 4], "ranks 0,2,4"),
        ([7, 8], "ranks 7-8"),
        (range(1, 1024), "ranks 1-1023"),
        ([0, 1, 3, 4, 9], "ranks 0-1,3-4,9"),
    ],
)
def test_rank_list(ranks, text):
    assert rank_list(ranks) == text


def test_describe_op():
    assert describe_op(ddp_broadcast()) == (
        "broadcast of module buffers inside DistributedDataParallel.forward called at val.py:42"
    )
    assert describe_op(ddp_broadcast(api=build.DDP_BUCKET_REBUILD)).startswith(
        "broadcast for DDP's gradient bucket rebuild inside"
    )
    assert describe_op(rec(1, "all_reduce", site=("x.py", 10, "f"))) == "all_reduce at x.py:10"
    assert (
        describe_op(rec(1, "all_gather", api="all_gather_into_tensor", site=("x.py", 10, "f")))
        == "all_gather (all_gather_into_tensor) at x.py:10"
    )
    inside = rec(1, "all_gather", site=("x.py", 10, "f"), region=object_region(("m.py", 3, "g")))
    assert describe_op(inside) == "all_gather inside all_gather_object at m.py:3"


def test_waiting_record_prefers_the_oldest_collective_over_p2p():
    old_p2p = rec(0, "recv", peer=1, age=50.0)
    collective = rec(4, "all_reduce", age=5.0)
    younger = rec(5, "broadcast", age=4.0)
    state = rank_state(0, 2, inflight=[old_p2p, younger, collective])
    assert analysis.waiting_record(state) is collective
    assert analysis.waiting_record(rank_state(0, 2, inflight=[old_p2p])) is old_p2p
    assert analysis.waiting_record(rank_state(0, 2)) is None


# ---------------------------------------------------------------- every finding is well-formed


def _scenarios():
    ar, br = rec(4, "all_reduce", site=("x.py", 10, "f")), rec(4, "broadcast", site=("x.py", 20, "f"))
    bar = rec(4, "barrier", site=("x.py", 20, "f"))
    return {
        "seed": seed_states(2),
        "seed3": seed_states(3),
        "rebuild": seed_states(2, api=build.DDP_BUCKET_REBUILD),
        "barrier_rule": states(rank_state(0, 2, inflight=[ar]), rank_state(1, 2, inflight=[bar])),
        "mismatch": states(rank_state(0, 2, inflight=[ar]), rank_state(1, 2, inflight=[br])),
        "straggler": states(
            rank_state(0, 2, idle=999.0, user_line=("val.py", 40, "v")),
            rank_state(1, 2, inflight=[barrier(age=999.0)], idle=999.0),
        ),
    }


@pytest.mark.parametrize("name", sorted(_scenarios()))
def test_findings_are_well_formed(name, tmp_path):
    st = _scenarios()[name]
    a = run(st)
    assert a.verdict in (DEADLOCK, TIMEOUT)
    assert a.findings
    for data in a.findings:
        assert set(data) == DATA_KEYS
        f = worded(data)
        assert set(f) == FINDING_KEYS
        assert f["kind"] in analysis.FINDING_KINDS
        assert f["ranks"] == sorted(f["ranks"]) and f["ranks"]
        assert set(f["ranks"]) <= set(st)
        assert isinstance(f["summary"], str) and f["summary"]
        assert isinstance(f["fix"], str) and f["fix"]
        assert set(f["location"]) == {"file", "line", "function"}
        assert isinstance(f["evidence"], dict)
    # Worded, JSON-native: survives the incident file round trip unchanged.
    as_written = [worded(f) for f in a.findings]
    (tmp_path / "x.json").write_text(documents.dumps({"format_version": 1, "f": as_written}), encoding="utf-8")
    assert documents.load_document(str(tmp_path / "x.json"))["f"] == as_written


# ---------------------------------------------------------------- once bugs, now fixed


def test_majority_in_ddp_forward_is_innocent():
    """Rank 2 runs `if rank == 2: dist.all_reduce(t)` at x.py:10; ranks 0,1 go on to the next model(x) at
    train.py:60 and block in its buffer broadcast. Rank 2 is the culprit (collective_on_subset, majority rule)."""
    history = [
        done(
            s,
            "broadcast",
            api="_broadcast_coalesced",
            site=("train.py", 60, "train"),
            region=ddp_region(("train.py", 60, "train")),
        )
        for s in (8, 9)
    ]
    st = states(
        rank_state(0, 3, inflight=[ddp_broadcast(call_site=("train.py", 60, "train"))], recent=history),
        rank_state(1, 3, inflight=[ddp_broadcast(call_site=("train.py", 60, "train"))], recent=history),
        rank_state(2, 3, inflight=[rec(SEED_SEQ, "all_reduce", site=("x.py", 10, "f"))], recent=history),
    )
    f = only(run(st))
    assert f["kind"] == "collective_on_subset"
    assert f["ranks"] == [2]


def test_matching_send_and_recv_are_not_a_deadlock():
    st = states(
        rank_state(0, 2, inflight=[rec(0, "send", peer=1, site=("pipe.py", 30, "step"))]),
        rank_state(1, 2, inflight=[rec(0, "recv", peer=0, site=("pipe.py", 34, "step"))]),
    )
    assert run(st).verdict != DEADLOCK


def _late_functional_rank(waited: bool, history: bool = True) -> F.Trace:
    """A correct job seen under a CPU hog (the suite's run beside one, 7f2503c): rank 0 completed a functional
    all_reduce (seq 0) and waits in the calls after it; rank 1 holds seq 0 returned, `waited` or not: it was
    importing DTensor's modules for 4 s before waiting on it. `history`: rank 0 still remembers completing seq 0."""

    def functional(seq, op, api, age, waited_on):
        return dict(F.rec(seq, op, api=f"funcol.{api}", age=age), **{"async": True, "waited": waited_on})

    ahead = [
        functional(1, "all_gather", "all_gather_single", 0.83, True),
        functional(2, "all_reduce", "all_reduce", 0.82, False),
        functional(3, "all_gather", "all_gather_single", 0.79, False),
    ]
    done = [F.rec(0, "all_reduce", api="funcol.all_reduce", state="completed")] if history else []
    behind = [functional(0, "all_reduce", "all_reduce", 3.7, waited)]
    rank0 = F.rank_state(0, 2, inflight=ahead, recent=done, idle=0.8)
    return F.Trace(F.states(rank0, F.rank_state(1, 2, inflight=behind, idle=3.7)), 2)


def test_a_rank_behind_holding_only_a_returned_op_nobody_waits_on_is_late_not_a_proven_mismatch():
    late = _late_functional_rank(waited=False, history=False)
    assert analysis.assess(late.states, late.world_size, 0.5, 60.0).verdict is None  # before: collective_mismatch
    # the same positions with rank 1 inside wait_tensor() on it: it waits there, and that is proven, as before
    stuck = _late_functional_rank(waited=True, history=False)
    assert analysis.assess(stuck.states, stuck.world_size, 0.5, 60.0).verdict is not None


def _inside_first_call(completed_op="all_reduce", completed_shapes=((8,),)) -> F.Trace:
    """The second form of that false proof (702a283's third run beside a CPU hog): rank 1 is still inside its first
    functional all_reduce, whose op it issued (the call has not returned: DTensor's modules import for seconds),
    while rank 0 completed that position (`completed_op` on `completed_shapes`) and waits at the next."""
    done = F.rec(0, completed_op, api=f"funcol.{completed_op}", state="completed", shapes=completed_shapes)
    ahead = F.rec(1, "all_gather", api="funcol.all_gather_single", age=0.8)
    behind = F.rec(0, "all_reduce", api="funcol.all_reduce", age=3.7)
    rank0 = F.rank_state(0, 2, inflight=[ahead], recent=[done], idle=0.8)
    return F.Trace(F.states(rank0, F.rank_state(1, 2, inflight=[behind], idle=3.7)), 2)


def test_a_rank_inside_a_call_that_a_peer_completed_is_late_not_blocked():
    late = _inside_first_call()
    assert analysis.matched_elsewhere({1: late.states[1]["inflight"][0]}, late.states) == {1}
    assert analysis.assess(late.states, late.world_size, 0.5, 60.0).verdict is None  # before: collective_mismatch
    # a late rank that never comes back still ends in a report: the peers' waits pass the timeout, naming it
    for rank, age in ((0, 5.0), (1, 7.0)):
        late.states[rank].update(idle_s=age)
        late.states[rank]["inflight"][0]["age_s"] = age
    later = analysis.assess(late.states, late.world_size, 0.5, 3.0)
    assert later.verdict == TIMEOUT and [(f["kind"], f["ranks"]) for f in later.findings] == [("straggler", [1])]


@pytest.mark.parametrize(
    "op, shapes",
    [
        ("all_reduce", ((16,),)),  # other tensors: the two calls did not match
        ("broadcast", ((8,),)),  # a rooted call: its record cannot say whether the roles matched
    ],
)
def test_a_peer_that_completed_another_call_at_that_position_proves_nothing_matched(op, shapes):
    stuck = _inside_first_call(op, shapes)
    assert analysis.matched_elsewhere({1: stuck.states[1]["inflight"][0]}, stuck.states) == set()
    assert analysis.assess(stuck.states, stuck.world_size, 0.5, 60.0).verdict is not None
