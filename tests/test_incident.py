"""One incident builder: an incident analysed again offline equals the live one, field by field (no torch)."""

import copy
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import TORCH_FILE, main_stack, rank_state, rec, seed_states, states  # noqa: E402

from ddpwatch import analysis
from ddpwatch.analysis import incident
from ddpwatch.render.wording import worded_incident  # noqa: E402
from ddpwatch.sources import merge, report_command  # noqa: E402
from ddpwatch.static import rankcond  # noqa: E402

GRACE, TIMEOUT_S = 2.0, 300.0


def live(st, world_size, silent=None, timeout=TIMEOUT_S):
    """What the watchdog writes: assess, then build with the findings and the verdict it acted on, worded."""
    assessment = analysis.assess(st, world_size, GRACE, timeout, silent)
    assert assessment.verdict is not None
    final = dict(st)
    for rank, view in (silent or {}).items():
        final.setdefault(rank, dict(view["last_state"], stale=True))
    return worded_incident(
        incident.build(
            final,
            world_size,
            GRACE,
            timeout,
            silent=silent,
            trigger=assessment.verdict,
            findings=assessment.findings,
            run_id="20260101-000000-job",
            written_by=0,
            created_at=1.0e9,
            missing_ranks=[r for r in range(world_size) if r not in st],
        )
    )


def seed_with_condition():
    st = seed_states()
    st[0]["rank_condition"] = {
        "frame": {"file": "/u/train.py", "line": 90, "function": "train"},
        "condition": {"line": 89, "text": "if rank == 0:", "kind": "if"},
    }
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
    again = worded_incident(incident.reanalyze(copy.deepcopy(saved)))
    assert again == saved
    assert (
        doc["trigger"] == {"seed": "deadlock", "straggler": "timeout", "stuck": "timeout", "dead": "silent_rank"}[case]
    )
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
    doc = incident.build(
        st, 2, GRACE, TIMEOUT_S, trigger=analysis.DUMP, findings=[], run_id="r", written_by=0, created_at=1.0e9
    )
    assert incident.reanalyze(json.loads(json.dumps(doc)))["trigger"] == analysis.DUMP


def test_report_reanalyze_goes_through_the_builder():
    st = seed_with_condition()
    doc = json.loads(json.dumps(live(st, 2)))
    doc["findings"] = []
    assert report_command.incident_module.reanalyze(doc, None, None)["findings"][0]["kind"] == "ddp_forward_on_subset"


def _keys(shape) -> set:
    import typing

    return set(typing.get_type_hints(shape))


def test_the_named_shapes_say_what_the_stages_really_pass():
    from ddpwatch.format import types
    from ddpwatch.capture.record import Recorder

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


# The user's code in the seed stall: rank 0 alone calls the DDP model (line 3), under `if rank == 0:`.
RANK_ZERO_SOURCE = """\
def validate(rank, model, x):
    if rank == 0:
        model(x)
    dist.barrier()
"""


def _taken_with_sources(tmp_path):
    """(incident, source file): the seed stall taken as the watchdog takes it, rank 0's stack in a real source file
    whose rank condition its state does not carry (only the stack says where it stands)."""
    source = tmp_path / "job" / "val.py"
    source.parent.mkdir()
    source.write_text(RANK_ZERO_SOURCE)
    st = seed_states()
    st[0]["stacks"] = [main_stack((str(source), 3, "validate"), (TORCH_FILE, 2400, "_broadcast_coalesced", True))]
    assessment = analysis.assess(st, 2, GRACE, TIMEOUT_S, None)
    rankcond.clear_cache()
    doc = incident.build(
        st,
        2,
        GRACE,
        TIMEOUT_S,
        trigger=assessment.verdict,
        findings=assessment.findings,
        run_id="20260101-000000-job",
        written_by=0,
        created_at=1.0e9,
        rank_conditions=rankcond.capture_rank_conditions(st),
    )
    return doc, source


def _report(*argv, capsys) -> str:
    from ddpwatch import cli

    assert cli.main(["report", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_reanalysed_elsewhere_with_the_sources_gone_the_report_is_the_live_one(tmp_path, capsys, fmt):
    """Issue 20.4: the incident keeps the rank conditions read when it was taken; `ddpwatch report --reanalyze` of a
    copy on a machine without the user's sources words its findings as the live report did, byte for byte."""
    import shutil

    from ddpwatch.format import documents
    from ddpwatch.render import report

    doc, source = _taken_with_sources(tmp_path)
    from ddpwatch.render import wording

    assert "under the rank condition `if rank == 0:`" in wording.worded_incident(doc)["findings"][0]["summary"]
    folder, _ = documents.save_incident(str(tmp_path / "reports"), doc["run_id"], doc, report.renderings)
    elsewhere = tmp_path / "another-machine" / "incident"
    shutil.copytree(folder, elsewhere)
    shutil.rmtree(source.parent)
    shutil.rmtree(folder)
    rankcond.clear_cache()
    live = _report(str(elsewhere), "--format", fmt, capsys=capsys)
    again = _report(str(elsewhere), "--reanalyze", "--format", fmt, capsys=capsys)
    assert "if rank == 0:" in live
    assert again == live


class _FileRead(BaseException):
    """Raised by a file-reading call during the analysis: a BaseException, so no `except Exception` hides it."""


def test_the_analysis_of_an_incident_opens_no_file(tmp_path, monkeypatch):
    """Reanalysing calls nothing that reads a file (open, os.open, os.stat, tokenize.open, linecache)."""
    import builtins
    import io
    import linecache
    import tokenize

    doc, source = _taken_with_sources(tmp_path)
    saved = json.loads(json.dumps(doc))
    rankcond.clear_cache()
    reads = []

    def refuse(name):
        def read(*args, **kwargs):
            reads.append(name)
            raise _FileRead(name)

        return read

    for module, name in (
        (builtins, "open"),
        (io, "open"),
        (os, "open"),
        (os, "stat"),
        (tokenize, "open"),
        (linecache, "getlines"),
    ):
        monkeypatch.setattr(module, name, refuse(f"{module.__name__}.{name}"))
    try:
        again = incident.reanalyze(copy.deepcopy(saved))
    finally:
        monkeypatch.undo()
    assert reads == []
    assert json.loads(json.dumps(again)) == saved  # facts hold tuples in memory, lists once written


def test_an_incident_written_before_rank_conditions_were_kept_loads_and_reanalyses_as_before(tmp_path, capsys):
    """No `rank_conditions` (an older writer): the file still loads, and --reanalyze, on the machine that has the
    sources, reads them in the loader (never in the analysis) and words the finding as that writer did."""
    from ddpwatch.format import documents

    doc, source = _taken_with_sources(tmp_path)
    from ddpwatch.render import wording

    old = json.loads(json.dumps(wording.worded_incident(doc)))  # as report.json has it
    del old["rank_conditions"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(old))
    assert "rank_conditions" not in documents.load_incident(str(path))
    assert "rank_conditions" not in json.loads(_report(str(path), "--format", "json", capsys=capsys))
    rankcond.clear_cache()
    again = json.loads(_report(str(path), "--reanalyze", "--format", "json", capsys=capsys))
    assert again["findings"] == wording.worded_incident(doc)["findings"]
    assert again["rank_conditions"] == doc["rank_conditions"]


def test_ranks_standing_at_the_same_lines_share_one_lookup_but_not_one_dict(tmp_path, monkeypatch):
    source = tmp_path / "val.py"
    source.write_text(RANK_ZERO_SOURCE)
    stack = [main_stack((str(source), 3, "validate"))]
    st = states(*[rank_state(r, 3, stacks=copy.deepcopy(stack)) for r in range(3)])
    st[2]["rank_condition"] = {
        "frame": {"file": "/u/a.py", "line": 1, "function": "f"},
        "condition": {"line": 1, "text": "if rank:", "kind": "if"},
    }
    looked_up = []
    monkeypatch.setattr(
        rankcond,
        "rank_condition_of",
        lambda state: (
            looked_up.append(1)
            or {
                "frame": {"file": str(source), "line": 3, "function": "validate"},
                "condition": {"line": 2, "text": "if rank == 0:", "kind": "if"},
            }
        ),
    )
    captured = rankcond.capture_rank_conditions(st)
    assert sorted(captured) == ["0", "1"] and len(looked_up) == 1  # rank 2 carries its own condition
    assert captured["0"] == captured["1"] and captured["0"]["frame"] is not captured["1"]["frame"]
