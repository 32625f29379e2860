"""analysis.FINDING_PASSES, the one table of finding kinds: its order decides, a new kind is one row (plus its words in
render/wording.py's SENTENCES), no row is dead, and a pass hands over facts, never words.

Hand-built traces from factory.py, no torch.
"""

import functools
import inspect
import json
import os
import sys
from unittest import mock

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import factory as F  # noqa: E402

from ddpwatch import analysis
from ddpwatch.analysis import incident, passes
from ddpwatch import render
from ddpwatch.format import validate
from ddpwatch.format.version import FormatError
from ddpwatch.render import report, wording  # noqa: E402

GRACE, TIMEOUT_S = 2.0, 300.0


def run(trace, passes=None):
    """assess() over the trace; `passes`: a table to run instead of analysis.FINDING_PASSES, patched in for the call
    (the table is read when assess runs)."""
    with mock.patch.object(analysis, "FINDING_PASSES", analysis.FINDING_PASSES if passes is None else passes):
        return analysis.assess(trace.states, trace.world_size, GRACE, TIMEOUT_S, trace.silent)


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
    with mock.patch.object(analysis, "FINDING_PASSES", swapped(first, second)):
        assert [f["kind"] for f in analysis.classify(parts, trace.states)] == [second_kind]


def test_the_table_is_read_when_assess_runs_so_a_patched_table_reaches_every_caller(monkeypatch):
    trace = F.trace_shape_mismatch_in_ddp_forward()
    monkeypatch.setattr(analysis, "FINDING_PASSES", swapped(analysis.shape_mismatch, analysis.ddp_forward_on_subset))
    built = incident.build(trace.states, trace.world_size, GRACE, TIMEOUT_S)
    assert [f["kind"] for f in built["findings"]] == ["ddp_forward_on_subset"]


# ---------------------------------------------------------------- a new kind is one row, one pass, one wording entry


def odd_one_out(parts, states):
    """A made-up pass: the smallest partition is to blame, whatever it waits in. Facts only: no words."""
    smallest = min(parts, key=lambda p: (len(p.ranks), p.ranks))
    return passes.finding(
        "odd_one_out",
        smallest.ranks,
        smallest.record.get("site"),
        {"apart": len(smallest.ranks)},
        culprits=smallest.ranks,
        record=smallest.record,
    )


def odd_one_out_words(facts, ranks_text=wording.rank_list):
    """The made-up kind's wording entry: its facts -> (summary, fix)."""
    who = ranks_text(facts["culprits"])
    return (f"{who[:1].upper() + who[1:]} stands apart in {wording.describe_op(facts['record'])}.", "Bring it back.")


def test_a_new_kind_is_one_row_one_pass_and_one_wording_entry_and_reaches_every_renderer(monkeypatch):
    trace = F.trace_lone_barrier()
    assert kinds(run(trace)) == ["collective_on_subset"]
    assert "odd_one_out" not in analysis.FINDING_KINDS

    new_row = analysis.FindingPass(odd_one_out, analysis.STAGE_MISMATCH, ("odd_one_out",))
    monkeypatch.setattr(analysis, "FINDING_PASSES", (new_row,) + analysis.FINDING_PASSES)
    monkeypatch.setitem(wording.SENTENCES, "odd_one_out", odd_one_out_words)

    assert "odd_one_out" in analysis.kinds_of(analysis.FINDING_PASSES)
    [found] = analysis.classify(mismatch_parts(trace), trace.states)
    assert (found["kind"], found["ranks"]) == ("odd_one_out", [0])
    assessment = run(trace)
    assert (assessment.verdict, kinds(assessment)) == (analysis.DEADLOCK, ["odd_one_out"])
    built = incident.build(trace.states, trace.world_size, GRACE, TIMEOUT_S)
    assert (built["trigger"], [f["kind"] for f in built["findings"]]) == ("deadlock", ["odd_one_out"])
    sentence = "Rank 0 stands apart in all_reduce at"
    for fmt in report.FORMATS:
        text = report.render_format(built, fmt)
        assert "odd_one_out" in text and sentence in text, fmt
    [written] = json.loads(report.render_format(built, "json"))["findings"]
    assert list(written) == ["kind", "ranks", "summary", "fix", "location", "evidence", "facts", "basis"]
    # a kind not given a status in KIND_STATUS is a reading, even at a stage that proves a deadlock: never acted on
    assert (written["basis"]["status"], written["basis"]["acts"]) == ("reading", False)
    assert (written["summary"].startswith(sentence), written["fix"], written["evidence"]) == (
        True,
        "Bring it back.",
        {"apart": 1},
    )
    assert written["facts"]["culprits"] == [0]


def test_a_kind_without_its_wording_entry_cannot_be_rendered(monkeypatch):
    trace = F.trace_lone_barrier()
    new_row = analysis.FindingPass(odd_one_out, analysis.STAGE_MISMATCH, ("odd_one_out",))
    built = incident.build(
        trace.states,
        trace.world_size,
        GRACE,
        TIMEOUT_S,
        findings=run(trace, passes=(new_row,) + analysis.FINDING_PASSES).findings,
    )
    with pytest.raises(KeyError, match="odd_one_out"):
        report.render_format(built, "json")


def test_every_kind_of_the_table_has_its_words_and_no_words_are_left_without_a_kind():
    assert set(wording.SENTENCES) == set(analysis.FINDING_KINDS)


def test_a_pass_may_emit_only_the_kinds_its_row_names():
    wrong = analysis.FindingPass(odd_one_out, analysis.STAGE_MISMATCH, ("collective_mismatch",))
    with pytest.raises(ValueError, match="odd_one_out emitted finding kind 'odd_one_out'"):
        run(F.trace_lone_barrier(), passes=(wrong,) + analysis.FINDING_PASSES)


def worded_pass(parts, states):
    """A pass in the old manner: it writes its own summary and fix."""
    smallest = min(parts, key=lambda p: (len(p.ranks), p.ranks))
    return {
        "kind": "odd_one_out",
        "ranks": smallest.ranks,
        "summary": "It stands apart.",
        "fix": "Bring it back.",
        "location": None,
        "evidence": {},
    }


def test_a_pass_hands_over_facts_never_words_of_its_own():
    wrong = analysis.FindingPass(worded_pass, analysis.STAGE_MISMATCH, ("odd_one_out",))
    with pytest.raises(ValueError, match="worded_pass emitted a finding without facts or with words of its own"):
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
    "local_decision": F.trace_early_stop,
    "caught_exception": F.trace_caught_exception,
    "collective_mismatch": F.trace_different_collectives,
    "collective_stuck": F.trace_everyone_in_one_call,
    "straggler": F.trace_busy_peer,
    "p2p_deadlock": F.trace_send_cycle,
    "silent_mismatch": F.trace_float_against_int,
    "crossed_collectives": F.trace_crossed_metrics,
    "mismatch_crash": F.trace_mismatch_crash,
}
# Rows the traces above do not reach first, and a trace that does.
MORE_TRACES = {
    "collective_mismatch at different positions": (F.trace_different_positions, "collective_mismatch"),
    "skipped_collective by an exited rank": (F.trace_exited_peer, "skipped_collective"),
    "local_decision of a rank that exited": (F.trace_exited_after_early_stop, "local_decision"),
    "caught_exception of a rank at a later position": (F.trace_departed_ahead, "caught_exception"),
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


# ---------------------------------------------------------------- words are render's, and a saved report keeps them


@pytest.mark.parametrize("kind", sorted(TRACE_OF_KIND))
def test_a_report_read_back_renders_as_the_fresh_one_from_its_stored_facts(kind, monkeypatch):
    """report.json keeps each finding's facts (lists where the analysis had tuples): read back, every format renders
    the same bytes, and report.txt and report.html word the summary from the facts, with the short rank lists."""
    monkeypatch.setattr(render, "RANKS_TEXT_BUDGET", 0)  # every rank list shortened, even on two ranks
    trace = TRACE_OF_KIND[kind]()
    built = incident.build(
        trace.states,
        trace.world_size,
        GRACE,
        TIMEOUT_S,
        silent=trace.silent,
        run_id="r",
        written_by=0,
        created_at=1.0e9,
    )
    assert [f["kind"] for f in built["findings"]] == [kind] and "summary" not in built["findings"][0]
    saved = json.loads(report.render_format(built, "json"))
    [finding] = saved["findings"]
    assert finding["summary"] and isinstance(finding["facts"], dict)
    validate.incident(saved, "report.json")
    for fmt in report.FORMATS:
        assert report.render_format(saved, fmt) == report.render_format(built, fmt), fmt
    said = wording.summary_for_people(finding, render.short_rank_list)
    assert said == wording.summary_for_people(wording.worded(built["findings"][0]), render.short_rank_list)
    assert (said == finding["summary"]) == (kind in SUMMARY_WITHOUT_RANK_LIST), said  # worded again, not stored
    assert said in " ".join(report.render_format(saved, "text").split())


# Kinds whose summary names no rank list ("Rank 3", "All 2 ranks").
SUMMARY_WITHOUT_RANK_LIST = {"dead_rank", "unresponsive_rank", "collective_stuck"}


def trace_even_ranks_in_a_lone_barrier(world_size: int) -> F.Trace:
    barrier, reduce = F.rec(4, "barrier", site=("x.py", 20, "f")), F.rec(4, "all_reduce", site=("x.py", 10, "f"))
    return F.Trace(
        F.states(*(F.rank_state(r, world_size, inflight=[reduce if r % 2 else barrier]) for r in range(world_size))),
        world_size,
    )


def test_at_40_ranks_people_read_short_rank_lists_and_report_json_the_full_ones():
    trace = trace_even_ranks_in_a_lone_barrier(40)
    built = incident.build(trace.states, trace.world_size, GRACE, TIMEOUT_S, run_id="r", written_by=0, created_at=1.0e9)
    saved = json.loads(report.render_format(built, "json"))
    assert "ranks 0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32,34,36,38" in saved["findings"][0]["summary"]
    said = (
        "Ranks 1,3,5,7,9,11,13,...,39 (20 ranks) called all_reduce at x.py:10 (/u/x.py:10 in f()), which "
        "ranks 0,2,4,6,8,10,12,...,38 (20 ranks) do not call at this point"
    )
    for fmt in ("text", "html"):
        live, read_back = report.render_format(built, fmt), report.render_format(saved, fmt)
        assert live == read_back and said in " ".join(live.split()), fmt
    assert "0,2,4,6,8,10,12,14" not in report.render_format(built, "text")  # html keeps full lists in attributes


def crafted_facts():
    """Facts a hand-edited report.json could hold: each breaks the words somewhere."""
    return {
        "empty": {},
        "wrong_types": {"culprits": 5, "record": "x", "innocent": 3, "location": [], "waiting": None},
        "ranks_that_are_not_numbers": {"culprits": ["a", 1], "record": {"op": "x"}},
        "a_record_without_op": {"culprits": [0], "record": {}, "location": None, "innocent": None, "condition": None},
        "unpacking_too_few": {"culprits": [0], "innocent": [], "culprit_record": None, "location": None},
        "deep": {"culprits": [[[[[[[[0]]]]]]]]},
    }


@pytest.mark.parametrize("name", sorted(crafted_facts()))
@pytest.mark.parametrize("kind", sorted(TRACE_OF_KIND))
def test_crafted_facts_show_the_stored_summary_never_a_traceback(kind, name):
    trace = TRACE_OF_KIND[kind]()
    built = incident.build(
        trace.states,
        trace.world_size,
        GRACE,
        TIMEOUT_S,
        silent=trace.silent,
        run_id="r",
        written_by=0,
        created_at=1.0e9,
    )
    saved = json.loads(report.render_format(built, "json"))
    saved["findings"][0]["facts"] = crafted_facts()[name]
    saved["findings"][0]["summary"] = "The stored summary, shown as it is."
    validate.incident(saved, "report.json")
    for fmt in ("text", "html"):
        assert "The stored summary, shown as it is." in report.render_format(saved, fmt), (fmt, kind, name)


def test_a_finding_without_facts_shows_its_stored_summary_as_it_is():
    """A report.json written before facts were kept: its prose is shown as written, no rank list in it parsed."""
    trace = trace_even_ranks_in_a_lone_barrier(40)
    saved = json.loads(report.render_format(incident.build(trace.states, trace.world_size, GRACE, TIMEOUT_S), "json"))
    del saved["findings"][0]["facts"]
    summary = saved["findings"][0]["summary"] = "Ranks 0,2,4,6,8,10,12,14,16,18,20,22,24,26,28 stand apart."
    assert summary in report.render_format(saved, "html")
    assert summary in " ".join(report.render_format(saved, "text").split())


@pytest.mark.parametrize("facts", [[], "x", 3, None])
def test_facts_that_are_not_an_object_are_refused_on_reading(facts):
    trace = TRACE_OF_KIND["collective_on_subset"]()
    saved = json.loads(report.render_format(incident.build(trace.states, trace.world_size, GRACE, TIMEOUT_S), "json"))
    saved["findings"][0]["facts"] = facts
    with pytest.raises(FormatError, match=r"findings\[0\]\.facts: expected an object"):
        validate.incident(saved, "report.json")


@pytest.mark.parametrize("kind", sorted(TRACE_OF_KIND))
def test_facts_give_the_same_words_with_tuples_in_memory_and_lists_read_back(kind, monkeypatch):
    monkeypatch.setattr(render, "RANKS_TEXT_BUDGET", 0)  # the short rank lists too, even on two ranks
    trace = TRACE_OF_KIND[kind]()
    [found] = run(trace).findings
    read_back = json.loads(json.dumps(found["facts"]))
    assert read_back != found["facts"] or kind in (
        "dead_rank",
        "unresponsive_rank",
        "straggler",
        "collective_stuck",
        "p2p_deadlock",
        "local_decision",
        "caught_exception",
        "silent_mismatch",
        "crossed_collectives",
        "mismatch_crash",
    )
    for ranks_text in (wording.rank_list, render.short_rank_list):
        sentences = wording.SENTENCES[kind]
        assert sentences(read_back, ranks_text) == sentences(found["facts"], ranks_text), ranks_text.__name__


def test_every_wording_entry_takes_the_rank_list_function_people_are_shown():
    """report.txt and report.html pass short_rank_list; an entry that cannot take it would fall back, unseen, to the
    stored summary with its full rank lists."""
    for kind, words in wording.SENTENCES.items():
        assert len(inspect.signature(words).parameters) == 2, kind
