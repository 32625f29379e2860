"""`ddpwatch report PATH...`: rank-<r>.json files written separately (the store was gone), found, merged, analysed."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import incident, seed_states  # noqa: E402

from ddpwatch import analysis, cli
from ddpwatch.config import DEFAULTS
from ddpwatch.format.version import FORMAT_VERSION
from ddpwatch.sources import merge
from ddpwatch.format import documents  # noqa: E402
from ddpwatch.render import report  # noqa: E402


def write_rank(folder, state, name=None):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or f"rank-{state['rank']}.json")
    path.write_text(json.dumps(state))
    return path


def run(capsys, *argv):
    code = cli.main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys, *argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("ddpwatch report: ") and err.count("\n") == 1, err
    return err


def test_rank_files_in_two_host_folders_merge_into_the_seed_verdict(tmp_path, capsys):
    st = seed_states(3)
    write_rank(tmp_path / "host-a" / "ddpwatch-reports" / "run1", st[0])
    write_rank(tmp_path / "host-b" / "deep" / "er", st[1])
    write_rank(tmp_path / "host-b" / "deep", st[2])
    code, out, _ = run(capsys, str(tmp_path / "host-a"), str(tmp_path / "host-b"), "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert [(f["kind"], f["ranks"]) for f in doc["findings"]] == [("ddp_forward_on_subset", [0])]
    assert doc["world_size"] == 3 and doc["missing_ranks"] == [] and doc["written_by"] is None
    assert doc["trigger"] == "deadlock" and doc["grace"] == DEFAULTS["grace"] and doc["timeout"] == 300.0
    assert doc["source"]["kind"] == "rank_files" and len(doc["source"]["files"]) == 3
    assert [s["rank"] for s in doc["ranks"]] == [0, 1, 2]
    code, text, _ = run(capsys, str(tmp_path))
    assert code == 0 and "[ddp_forward_on_subset] culprit: rank 0 at val.py:42" in text
    assert "rebuilt from rank files" in text


def test_a_later_heartbeat_wins_for_a_duplicate_rank(tmp_path):
    st = seed_states(2)
    stale = json.loads(json.dumps(st[1]))
    stale["beat"], stale["inflight"] = 2, []  # an older snapshot: rank 1 not yet waiting
    st[1]["beat"] = 9
    write_rank(tmp_path / "a", st[1])
    write_rank(tmp_path / "b", stale)
    write_rank(tmp_path / "b", st[0])
    doc = merge.merged_incident([str(tmp_path / "a"), str(tmp_path / "b")])
    assert doc["ranks"][1]["beat"] == 9
    assert [f["kind"] for f in doc["findings"]] == ["ddp_forward_on_subset"]


def test_conflicting_world_size_is_a_clear_error(tmp_path, capsys):
    st = seed_states(2)
    other = json.loads(json.dumps(st[1]))
    other["world_size"] = 4
    write_rank(tmp_path / "a", st[0])
    write_rank(tmp_path / "b", other)
    err = one_line_error(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert "disagree on world_size: 2 (" in err and "4 (" in err and "one job" in err
    with pytest.raises(merge.MergeError):
        merge.merged_incident([str(tmp_path)])


def test_a_missing_rank_means_no_verdict_and_says_so(tmp_path, capsys):
    st = seed_states(3)
    write_rank(tmp_path, st[0])
    write_rank(tmp_path, st[1])
    doc = merge.merged_incident([str(tmp_path)])
    assert doc["missing_ranks"] == [2] and doc["findings"] == [] and doc["trigger"] == "dump"
    code, text, _ = run(capsys, str(tmp_path))
    assert code == 0 and "  rank 2: no state received" in text


def test_grace_and_timeout_options_reach_the_analysis(tmp_path, capsys):
    for state in seed_states(2).values():
        write_rank(tmp_path, state)
    code, out, _ = run(capsys, str(tmp_path), "--grace", "10", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["grace"] == 10.0 and doc["findings"] == []  # 3 s of waiting is not 10 s


def test_staging_folders_are_ignored_and_rank_files_can_be_named_directly(tmp_path, capsys):
    st = seed_states(2)
    write_rank(tmp_path / "run" / ".incoming-abc", st[0])  # a half-written incident folder: never read
    write_rank(tmp_path / "run", st[1])
    assert merge.find_rank_files([str(tmp_path)]) == [str(tmp_path / "run" / "rank-1.json")]
    a = write_rank(tmp_path / "x", st[0], name="from-host-a.json")
    code, out, _ = run(capsys, str(a), str(tmp_path / "run" / "rank-1.json"), "--format", "json")
    assert code == 0 and json.loads(out)["findings"][0]["ranks"] == [0]


def test_many_rank_files_show_a_progress_bar_on_stderr(tmp_path, capsys):
    for state in seed_states(64).values():
        write_rank(tmp_path / f"host{state['rank'] // 8}", state)
    code, out, err = run(capsys, str(tmp_path), "--format", "json")
    assert code == 0 and "reading rank files" in err
    assert json.loads(out)["findings"][0]["ranks"] == [0]
    for state in seed_states(8).values():
        write_rank(tmp_path / "small", state)
    code, _, err = run(capsys, str(tmp_path / "small"))
    assert code == 0 and err == ""


def test_a_folder_of_several_incidents_must_be_narrowed(tmp_path, capsys):
    for run_id in ("r1", "r2"):
        st = seed_states(2)
        doc = incident(st, analysis.assess(st, 2, 2.0, 300.0).findings)
        documents.save_incident(str(tmp_path), run_id, doc, report.renderings)
    err = one_line_error(capsys, str(tmp_path))
    assert "holds 2 incident folders" in err


@pytest.mark.parametrize(
    "fmt, check",
    [
        ("text", lambda out: out.startswith("=" * 80)),
        ("json", lambda out: json.loads(out)["format_version"] == FORMAT_VERSION),
        ("html", lambda out: out.startswith("<!DOCTYPE html>")),
        ("trace", lambda out: json.loads(out)["traceEvents"]),
    ],
)
def test_a_saved_incident_renders_in_every_format(tmp_path, capsys, fmt, check):
    st = seed_states(2)
    doc = incident(st, analysis.assess(st, 2, 2.0, 300.0).findings)
    folder, _ = documents.save_incident(str(tmp_path), "r1", doc, report.renderings)
    code, out, _ = run(capsys, folder, "--format", fmt)
    assert code == 0 and check(out)
    code, out, _ = run(capsys, os.path.join(folder, "report.json"), "--format", fmt, "--reanalyze")
    assert code == 0 and check(out)


def test_output_file_is_written_whole(tmp_path, capsys):
    for state in seed_states(2).values():
        write_rank(tmp_path / "dumps", state)
    target = tmp_path / "out" / "seed.html"
    target.parent.mkdir()
    code, out, err = run(capsys, str(tmp_path / "dumps"), "--format", "html", "-o", str(target))
    assert code == 0 and out == "" and f"wrote {target}" in err
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert os.listdir(target.parent) == ["seed.html"]  # no temp file left beside it


def test_reanalyze_with_a_saved_folder_still_works(tmp_path, capsys):
    st = seed_states(2)
    doc = incident(st, [])  # written before the analysis knew this kind
    folder, _ = documents.save_incident(str(tmp_path), "r1", doc, report.renderings)
    code, out, _ = run(capsys, folder, "--format", "json", "--reanalyze")
    assert code == 0 and json.loads(out)["findings"][0]["kind"] == "ddp_forward_on_subset"
    code, out, _ = run(capsys, folder, "--format", "json")
    assert json.loads(out)["findings"] == []


def test_input_errors_are_one_line(tmp_path, capsys):
    assert "no such file or folder" in one_line_error(capsys, str(tmp_path / "nope"))
    (tmp_path / "notes.txt").write_text("hello")
    assert "not a ddpwatch report.json or rank-<r>.json" in one_line_error(capsys, str(tmp_path / "notes.txt"))
    (tmp_path / "empty").mkdir()
    assert "no report.json or rank-<r>.json" in one_line_error(capsys, str(tmp_path / "empty"))
    future = seed_states(2)[0]
    future["format_version"] = 99
    write_rank(tmp_path / "future", future)
    assert "format_version 99" in one_line_error(capsys, str(tmp_path / "future"))
    write_rank(tmp_path / "list", [1, 2], name="rank-0.json")
    assert "not an object" in one_line_error(capsys, str(tmp_path / "list"))
    assert "give an incident folder" in one_line_error(capsys)
    (tmp_path / "fr").mkdir()
    assert "not both" in one_line_error(capsys, str(tmp_path / "empty"), "--flight-recorder", str(tmp_path / "fr"))
    for state in seed_states(2).values():
        write_rank(tmp_path / "good", state)
    assert "notes.txt: not a ddpwatch" in one_line_error(capsys, str(tmp_path / "notes.txt"), str(tmp_path / "good"))
    st = seed_states(2)
    doc = incident(st, analysis.assess(st, 2, 2.0, 300.0).findings)
    folder, _ = documents.save_incident(str(tmp_path / "inc"), "r1", doc, report.renderings)
    report_file = os.path.join(folder, "report.json")
    assert "not a ddpwatch rank snapshot" in one_line_error(capsys, report_file, str(tmp_path / "good"))


def test_files_of_two_runs_are_refused_naming_both(tmp_path, capsys):
    """Issue 43: README's glob, after three incidents, built one report from rank 0 of one job and rank 1 of another."""
    st = seed_states(2)
    write_rank(tmp_path / "a", dict(st[0], run="20261206-100000-aaaaaaaaaaaaaaaa"))
    write_rank(tmp_path / "b", dict(st[1], run="20261206-110000-bbbbbbbbbbbbbbbb"))
    err = one_line_error(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert "2 runs" in err and "aaaaaaaaaaaaaaaa" in err and "bbbbbbbbbbbbbbbb" in err and "ddpwatch report " in err
    write_rank(tmp_path / "c", dict(st[1], run="20261206-100000-aaaaaaaaaaaaaaaa"))
    assert [r["rank"] for r in merge.merged_incident([str(tmp_path / "a"), str(tmp_path / "c")])["ranks"]] == [0, 1]


def test_one_rank_written_by_two_processes_is_two_runs_even_in_files_without_a_run(tmp_path, capsys):
    st = seed_states(2)
    write_rank(tmp_path / "a", st[0])
    write_rank(tmp_path / "a", st[1])
    write_rank(tmp_path / "b", dict(st[1], pid=st[1]["pid"] + 1))  # another process as rank 1: another run
    err = one_line_error(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert "rank 1 is two processes" in err and "different runs" in err
