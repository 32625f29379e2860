"""analysis.FINDING_PASSES, the one table of finding kinds: its order decides, a new kind is one row, no row is dead.

Hand-built traces from factory.py, no torch.
"""

import functools
import inspect
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import factory as F  # noqa: E402

from ddpwatch import analysis
from ddpwatch.format import build as S
from ddpwatch.analysis import incident
from ddpwatch.render import report  # noqa: E402

GRACE, TIMEOUT_S = 2.0, 300.0


def run(trace, passes=None):
    return analysis.assess(trace.states, trace.world_size, GRACE, TIMEOUT_S, trace.silent, passes=passes)


def kinds(assessment):
    return [f["kind"] for f in assessment.findings]


def row_of(run_function):
    [row] = [r for r in analysis.FINDING_PASSES if r.run is run_function]
    return row


def swapped(a, b):
    """A copy of the table with the rows of passes `a` and `b` in each other's place."""
    rows = list(analysis.FINDING_PASSES)
    i, j = rows.index(row_of(a)), rows.index(row_of(b))
    rows[i], rows[j] = rows[j], rows[i]
    return tuple(rows)


def mismatch_parts(trace):
    [(_, parts)] = analysis.proven_mismatches(trace.states, trace.world_size)
    return parts


# ---------------------------------------------------------------- the table's order decides

TWO_RULES = [
    # a broadcast of 8 elements inside DDP.forward against one of 4 outside: a shape mismatch and a DDP forward
    # on a subset at once
    (F.trace_shape_mismatch_in_ddp_forward, analysis.shape_mismatch, analysis.ddp_forward_on_subset),
    # the seed stall: the DDP forward on rank 0 only, and (always applicable) the culprit rules
    (lambda: F.Trace(F.seed_states(2), 2), analysis.ddp_forward_on_subset, analysis.collective_on_subset_or_mismatch),
]


@pytest.mark.parametrize("build, first, second", TWO_RULES, ids=["shape_vs_ddp", "ddp_vs_culprit_rules"])
def test_where_two_passes_apply_the_earlier_row_wins_and_swapping_the_rows_swaps_the_verdict(build, first, second):
    trace = build()
    parts = mismatch_parts(trace)
    first_kind, second_kind = first(parts, trace.states)["kind"], second(parts, trace.states)["kind"]
    assert first_kind != second_kind  # both apply on their own, with different kinds

    assert kinds(run(trace)) == [first_kind]
    assert [f["kind"] for f in analysis.classify(parts, trace.states)] == [first_kind]
    assert kinds(run(trace, passes=swapped(first, second))) == [second_kind]
    assert [f["kind"] for f in analysis.classify(parts, trace.states, swapped(first, second))] == [second_kind]


def test_the_table_is_read_when_assess_runs_so_a_patched_table_reaches_every_caller(monkeypatch):
    trace = F.trace_shape_mismatch_in_ddp_forward()
    monkeypatch.setattr(analysis, "FINDING_PASSES", swapped(analysis.shape_mismatch, analysis.ddp_forward_on_subset))
    built = incident.build(trace.states, trace.world_size, GRACE, TIMEOUT_S)
    assert [f["kind"] for f in built["findings"]] == ["ddp_forward_on_subset"]


# ---------------------------------------------------------------- a new kind is one row

def odd_one_out(parts, states):
    """A made-up pass: the smallest partition is to blame, whatever it waits in."""
    smallest = min(parts, key=lambda p: (len(p.ranks), p.ranks))
    return S.finding("odd_one_out", smallest.ranks, "It stands apart.", "Bring it back.",
                     smallest.record.get("site"), {})


def test_a_new_kind_is_one_row_and_reaches_assess_classify_the_incident_and_every_renderer(monkeypatch):
    trace = F.trace_lone_barrier()
    assert kinds(run(trace)) == ["collective_on_subset"]
    assert "odd_one_out" not in analysis.FINDING_KINDS

    new_row = analysis.FindingPass(odd_one_out, analysis.STAGE_MISMATCH, ("odd_one_out",))
    monkeypatch.setattr(analysis, "FINDING_PASSES", (new_row,) + analysis.FINDING_PASSES)

    assert "odd_one_out" in analysis.kinds_of(analysis.FINDING_PASSES)
    [found] = analysis.classify(mismatch_parts(trace), trace.states)
    assert (found["kind"], found["ranks"]) == ("odd_one_out", [0])
    assessment = run(trace)
    assert (assessment.verdict, kinds(assessment)) == (analysis.DEADLOCK, ["odd_one_out"])
    built = incident.build(trace.states, trace.world_size, GRACE, TIMEOUT_S)
    assert (built["trigger"], [f["kind"] for f in built["findings"]]) == ("deadlock", ["odd_one_out"])
    for fmt in report.FORMATS:
        assert "odd_one_out" in report.render_format(built, fmt), fmt


def test_a_pass_may_emit_only_the_kinds_its_row_names():
    wrong = analysis.FindingPass(odd_one_out, analysis.STAGE_MISMATCH, ("collective_mismatch",))
    with pytest.raises(ValueError, match="odd_one_out emitted finding kind 'odd_one_out'"):
        run(F.trace_lone_barrier(), passes=(wrong,) + analysis.FINDING_PASSES)


def test_every_row_runs_in_a_known_stage_and_takes_that_stages_arguments():
    for row in analysis.FINDING_PASSES:
        assert row.stage in analysis.STAGES, row
        parameters = inspect.signature(row.run).parameters
        assert len(parameters) == len(row.stage.takes.split(", ")), (row.run.__name__, row.stage.takes)
        assert row.kinds and len(set(row.kinds)) == len(row.kinds), row
    assert {row.stage for row in analysis.FINDING_PASSES} == set(analysis.STAGES)


# ---------------------------------------------------------------- no kind, no row registered dead

# Every kind of the table, and the hand-built trace that gives it (tests/factory.py).
TRACE_OF_KIND = {
    "dead_rank": F.trace_vanished_peer,
    "unresponsive_rank": F.trace_stopped_peer,
    "group_order": F.trace_groups_in_opposite_orders,
    "shape_mismatch": F.trace_empty_tensor,
    "ddp_forward_on_subset": lambda: F.Trace(F.seed_states(2), 2),
    "collective_on_subset": F.trace_lone_barrier,
    "skipped_collective": F.trace_skip_after_matched_barrier,
    "uneven_inputs": F.trace_extra_training_step,
    "collective_mismatch": F.trace_different_collectives,
    "collective_stuck": F.trace_everyone_in_one_call,
    "straggler": F.trace_busy_peer,
}
# Rows the traces above do not reach first, and a trace that does.
MORE_TRACES = {
    "collective_mismatch at different positions": (F.trace_different_positions, "collective_mismatch"),
    "skipped_collective by an exited rank": (F.trace_exited_peer, "skipped_collective"),
}


def spied_table(won: set):
    """The table with each pass wrapped to note its name when it finds something."""
    def spied(row):
        @functools.wraps(row.run)
        def run_and_note(*arguments):
            found = row.run(*arguments)
            if found:
                won.add(row.run.__name__)
            return found
        return row._replace(run=run_and_note)
    return tuple(spied(row) for row in analysis.FINDING_PASSES)


@pytest.mark.parametrize("kind", sorted(TRACE_OF_KIND))
def test_each_kind_has_a_hand_built_trace_that_gives_it(kind):
    assert kinds(run(TRACE_OF_KIND[kind]())) == [kind]


def test_every_kind_and_every_row_of_the_table_is_reached_by_a_hand_built_trace():
    won: set = set()
    table = spied_table(won)
    cases = [(build, kind) for kind, build in TRACE_OF_KIND.items()] + list(MORE_TRACES.values())
    for build, kind in cases:
        assert kinds(run(build(), passes=table)) == [kind], build.__name__
    assert set(TRACE_OF_KIND) == set(analysis.FINDING_KINDS)
    assert won == {row.run.__name__ for row in analysis.FINDING_PASSES}
