"""One incident builder: an incident analysed again offline equals the live one, field by field (no torch)."""

import copy
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import rank_state, rec, seed_states, states  # noqa: E402

from ddpwatch import analysis
from ddpwatch.analysis import incident
from ddpwatch.sources import command, merge  # noqa: E402

GRACE, TIMEOUT_S = 2.0, 300.0


def live(st, world_size, silent=None, timeout=TIMEOUT_S):
    """What the watchdog writes: assess, then build with the findings and the verdict it acted on."""
    assessment = analysis.assess(st, world_size, GRACE, timeout, silent)
    assert assessment.verdict is not None
    final = dict(st)
    for rank, view in (silent or {}).items():
        final.setdefault(rank, dict(view["last_state"], stale=True))
    return incident.build(final, world_size, GRACE, timeout, silent=silent, trigger=assessment.verdict,
                          findings=assessment.findings, run_id="20260101-000000-job", written_by=0,
                          created_at=1.0e9, missing_ranks=[r for r in range(world_size) if r not in st])


def seed_with_condition():
    st = seed_states()
    st[0]["rank_condition"] = {"frame": {"file": "/u/train.py", "line": 90, "function": "train"},
                               "condition": {"line": 89, "text": "if rank == 0:", "kind": "if"}}
    return st


def straggler_states():
    return states(rank_state(0, 2, idle=400.0), rank_state(1, 2, inflight=[rec(3, "barrier", age=400.0)]))


def stuck_states():
    return states(*[rank_state(r, 2, inflight=[rec(3, "all_reduce", age=400.0)], idle=400.0) for r in (0, 1)])


def dead_rank():
    waiting = rank_state(0, 2, inflight=[rec(5, "barrier", age=20.0)], idle=20.0)
    last = rank_state(1, 2, inflight=[rec(4, "barrier", state="completed")], idle=0.1, pid=4242)
    silent = {1: {"silent_s": 15.0, "last_state": last, "process": {"exists": False}}}
    return states(waiting), silent


@pytest.mark.parametrize("case", ["seed", "straggler", "stuck", "dead"])
def test_reanalysed_offline_the_incident_is_the_live_one_hint_and_trigger_included(case):
    silent = None
    if case == "seed":
        st = seed_with_condition()
    elif case == "straggler":
        st = straggler_states()
    elif case == "stuck":
        st = stuck_states()
    else:
        st, silent = dead_rank()
    doc = live(st, 2, silent)
    saved = json.loads(json.dumps(doc))  # through the file format, as `ddpwatch report --reanalyze` reads it
    again = incident.reanalyze(copy.deepcopy(saved))
    assert again == saved
    assert doc["trigger"] == {"seed": "deadlock", "straggler": "timeout", "stuck": "timeout",
                              "dead": "silent_rank"}[case]
    if case == "seed":
        assert "if rank == 0:" in again["findings"][0]["summary"]  # the rank-condition hint survives offline


def test_merged_rank_files_give_the_live_trigger_and_hint(tmp_path):
    st = stuck_states()
    for rank, state in st.items():
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(state))
    merged = merge.merged_incident([str(tmp_path)])
    assert merged["trigger"] == "timeout"  # was "deadlock" when the trigger was guessed from the kinds
    assert [f["kind"] for f in merged["findings"]] == ["collective_stuck"]
    assert merged["source"]["kind"] == "rank_files"


def test_a_dump_with_nothing_wrong_stays_a_dump_when_reanalysed():
    st = states(rank_state(0, 2, idle=0.1), rank_state(1, 2, idle=0.1))
    doc = incident.build(st, 2, GRACE, TIMEOUT_S, trigger=analysis.DUMP, findings=[], run_id="r", written_by=0,
                         created_at=1.0e9)
    assert incident.reanalyze(json.loads(json.dumps(doc)))["trigger"] == analysis.DUMP


def test_report_reanalyze_goes_through_the_builder():
    st = seed_with_condition()
    doc = json.loads(json.dumps(live(st, 2)))
    doc["findings"] = []
    assert command.incident_module.reanalyze(doc, None, None)["findings"][0]["kind"] == "ddp_forward_on_subset"


def _keys(shape) -> set:
    import typing

    return set(typing.get_type_hints(shape))


def test_the_named_shapes_say_what_the_stages_really_pass():
    from ddpwatch.format import types
    from ddpwatch.runtime.record import Recorder

    doc = live(seed_with_condition(), 2)
    assert set(doc) <= _keys(types.Incident) and set(types.Incident.__required_keys__) <= set(doc)
    for finding in doc["findings"]:
        assert set(finding) == _keys(types.Finding)
    for state in doc["ranks"]:
        assert set(state) <= _keys(types.RankState), set(state) - _keys(types.RankState)
        for record in state["inflight"] + state["recent"]:
            assert set(record) <= _keys(types.RecordDoc), set(record) - _keys(types.RecordDoc)
    recorder = Recorder()
    record = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())
    assert set(record.to_dict(record.start_mono)) <= _keys(types.RecordDoc)
    assert set(types.RecordDoc.__required_keys__) <= set(record.to_dict(record.start_mono))
