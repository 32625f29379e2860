"""Outside text shown with its escapes visible, written without fail (lone surrogates); a job run from b'caf\\xe9'."""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import types

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from factory import done, incident, seed_states  # noqa: E402
from ranks import SCENARIOS, describe, load_only_report, run_case  # noqa: E402

from ddpwatch import analysis, cli, config, dump_client, registry, terminal  # noqa: E402
from ddpwatch.format import documents  # noqa: E402
from ddpwatch.render import report  # noqa: E402
from ddpwatch.render.text import render_text  # noqa: E402
from ddpwatch.sources import report_command  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a hostile rank, store writer or report.json can put in any string, and what each must look like once shown.
ATTACKS = {
    "window title (OSC 0)": ("\x1b]0;pwned\x07", r"\x1b]0;pwned\x07"),
    "clipboard write (OSC 52)": ("\x1b]52;c;cm0gLXJmIH4=\x07", r"\x1b]52;c;cm0gLXJmIH4=\x07"),
    "clear screen (CSI 2J)": ("\x1b[2J\x1b[H", r"\x1b[2J\x1b[H"),
    "carriage return, fake line": ("\rNo hang found", r"\rNo hang found"),
    "C1 CSI (0x9b)": ("\x9b31m", r"\x9b31m"),
    "newline, fake line": ("\nNo hang found", r"\nNo hang found"),
    "DEL and NUL": ("\x7f\x00", r"\x7f\x00"),
    "bidi override": ("\u202eexe.txt", r"\u202eexe.txt"),
    "lone surrogate": ("\ud800", r"\ud800"),
    "undecodable byte from os.fsdecode": (os.fsdecode(b"caf\xe9"), r"caf\xe9"),
}
HOSTILE = "".join(raw for raw, _ in ATTACKS.values())
# What must never reach a terminal raw: C0 but tab and newline, DEL, C1, bidi controls, separators, surrogates.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
STRUCTURAL = {"state", "status", "kind", "group", "thread"}  # values the renderer compares, not only shows


def hostile(value, key=None):
    """The incident with HOSTILE appended to every string it shows (keys and compared values left alone)."""
    if isinstance(value, dict):
        return {k: hostile(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [hostile(v, key) for v in value]
    if isinstance(value, str) and key not in STRUCTURAL:
        return value + HOSTILE
    return value


def seed():
    states = seed_states(2)
    for state in states.values():
        state["recent"] = [done(9, "all_reduce", age=30.0)]
        state["process"] = {"status": "sleeping", "cpu_percent": 1.0, "rss_mb": 300.0}
        state["progress_bars"] = [{"desc": "epoch", "n": 3, "total": 10, "since_update_s": 30.0}]
    return incident(states, analysis.assess(states, 2, 2.0, 300.0).findings)


def hostile_incident():
    doc = hostile(seed())
    doc["report_dir"] = "/reports/" + HOSTILE
    for state in doc["ranks"]:
        state["process"]["status"] += HOSTILE  # a psutil fact from the rank, shown as it is
    return doc


def assert_shown_safely(text):
    assert RAW.search(text) is None, repr(RAW.search(text).group(0))
    for _, shown in ATTACKS.values():
        assert shown in text
    assert not any(line.startswith("No hang found") for line in text.splitlines())


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_visible_writes_out_every_hostile_sequence(name):
    raw, shown = ATTACKS[name]
    assert terminal.visible(f"a{raw}b") == f"a{shown}b"
    assert terminal.visible("tab\tstays") == "tab\tstays"


def test_visible_keeps_newlines_only_when_asked():
    assert terminal.visible("one\ntwo\x1b[2J", keep_newlines=True) == "one\ntwo\\x1b[2J"
    assert terminal.visible("one\ntwo") == "one\\ntwo"


def test_the_text_report_shows_hostile_text_in_every_field_visibly():
    doc = hostile_incident()
    text = render_text(doc)
    assert_shown_safely(text)
    # Every outside field is there, escaped: the run id, summary, fix, sites, frames, host, process, bars, folder.
    for shown in (
        r"job7\x1b]0;pwned",
        r"node0\x1b]0;pwned",
        r"sleeping\x1b]0;pwned",
        r"epoch\x1b]0;pwned",
        r"validate\x1b]0;pwned",
        r"train.py\x1b]0;pwned",
        r"/reports/\x1b]0;pwned",
    ):
        assert shown in text, shown
    assert "\\" not in render_text(seed())  # plain text gains no escapes


def test_every_file_of_a_hostile_incident_is_written_and_shows_no_raw_control(tmp_path):
    folder, note = documents.save_incident(str(tmp_path), "r1", hostile_incident(), report.renderings)
    assert note == ""
    files = sorted(os.listdir(folder))
    assert files == ["rank-0.json", "rank-1.json", "report.html", "report.json", "report.txt", "trace.json"]
    for name in files:
        with open(os.path.join(folder, name), encoding="utf-8") as handle:  # strict: valid UTF-8 throughout
            text = handle.read()
        assert RAW.search(text) is None, (name, repr(RAW.search(text).group(0)))
    with open(os.path.join(folder, "report.txt"), encoding="utf-8") as handle:
        assert_shown_safely(handle.read())


def test_the_html_page_holds_no_raw_control_character():
    """A file, but `cat report.html` or a pager shows it on a terminal: escaped HTML still held a raw ESC."""
    page = report.render_format(hostile_incident(), "html")
    assert RAW.search(page) is None, repr(RAW.search(page).group(0))
    assert r"\x1b]52;c;cm0gLXJmIH4=\x07" in page


def test_json_output_is_valid_ascii_and_faithful_to_hostile_strings():
    doc = hostile_incident()
    text = report.render_format(doc, "json")
    assert text.isascii()
    assert json.loads(text) == doc


def test_an_incident_with_fsdecode_surrogates_writes_its_folder(tmp_path):
    doc = seed()
    path = os.fsdecode(b"/home/u/caf\xe9/train.py")
    for state in doc["ranks"]:
        for frame in state["stacks"][0]["frames"]:
            frame["file"] = path
    del doc["findings"][0]["facts"]  # as a report.json written before facts were kept: its summary shown as stored
    doc["findings"][0]["summary"] += " \udce9 \ud800"
    folder, _ = documents.save_incident(str(tmp_path), "r1", doc, report.renderings)
    with open(os.path.join(folder, "report.txt"), encoding="utf-8") as handle:
        text = handle.read()
    assert r"/home/u/caf\xe9/train.py" in text and r"\ud800" in text
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as handle:
        assert json.load(handle) == doc  # the JSON keeps the exact strings (as \u escapes)


def report_cli(*argv, **env):
    return subprocess.run(
        [sys.executable, "-m", "ddpwatch", "report", *argv],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT, **env),
    )


@pytest.fixture
def surrogate_report(tmp_path):
    doc = seed()
    del doc["findings"][0]["facts"]  # as a report.json written before facts were kept: its summary shown as stored
    doc["findings"][0]["summary"] = "rank 0 \ud800 is stuck \x1b]0;pwned\x07"
    doc["findings"][0]["location"]["file"] = "/u/caf\udce9.py"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))  # ensure_ascii: the file holds "\ud800", as a crafted one can
    return path


@pytest.mark.real
def test_report_command_prints_a_report_json_holding_a_lone_surrogate(surrogate_report):
    done_run = report_cli(str(surrogate_report))
    assert done_run.returncode == 0, done_run.stderr.decode(errors="replace")[-3000:]
    out = done_run.stdout.decode("utf-8")  # strict: what went out is UTF-8
    assert r"rank 0 \ud800 is stuck \x1b]0;pwned\x07" in out and r"caf\xe9" in out
    assert b"\x1b" not in done_run.stdout


@pytest.mark.real
def test_hostile_facts_are_worded_and_shown_escaped(tmp_path):
    """The summary people read is worded from the facts in report.json: text from outside in them is made visible
    as any other."""
    doc = seed()
    doc["findings"][0]["facts"]["call_site"]["file"] = "/u/caf\udce9\x1b]0;pwned\x07.py"
    doc["findings"][0]["summary"] = "the stored summary"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    done_run = report_cli(str(path))
    assert done_run.returncode == 0, done_run.stderr.decode(errors="replace")[-3000:]
    out = " ".join(done_run.stdout.decode("utf-8").split())
    assert r"(/u/caf\xe9\x1b]0;pwned\x07.py:42 in validate())" in out and "the stored summary" not in out
    assert b"\x1b" not in done_run.stdout


@pytest.mark.real
def test_report_command_under_an_ascii_terminal_escapes_what_it_cannot_encode(surrogate_report):
    doc = json.loads(surrogate_report.read_text())
    doc["findings"][0]["summary"] = "r\u00e9sum\u00e9 \ud800"
    surrogate_report.write_text(json.dumps(doc))
    done_run = report_cli(str(surrogate_report), PYTHONIOENCODING="ascii", LC_ALL="C")
    assert done_run.returncode == 0, done_run.stderr.decode(errors="replace")[-3000:]
    assert r"r\xe9sum\xe9 \ud800" in done_run.stdout.decode("ascii")


def test_report_command_one_line_error_shows_control_characters(tmp_path):
    missing = str(tmp_path / "x\x1b]0;pwned\x07\rddpwatch report: all fine")
    out, err = io.StringIO(), io.StringIO()
    args = types.SimpleNamespace(path=[missing], format="text", reanalyze=False, output=None)
    assert report_command.run_command(args, stdout=out, stderr=err) == 2
    line = err.getvalue()
    assert line.count("\n") == 1 and RAW.search(line) is None
    assert r"x\x1b]0;pwned\x07\rddpwatch report: all fine: no such file or folder" in line


def test_report_command_writes_output_file_with_surrogates(tmp_path, surrogate_report):
    target = tmp_path / "out.txt"
    out, err = io.StringIO(), io.StringIO()
    args = types.SimpleNamespace(path=[str(surrogate_report)], format="html", reanalyze=False, output=str(target))
    assert report_command.run_command(args, stdout=out, stderr=err) == 0, err.getvalue()
    assert r"\ud800" in target.read_text(encoding="utf-8")


# ---------------------------------------------------------------- a real job run from a folder named b'caf\xe9'


@pytest.mark.real
@pytest.mark.timeout(200)
def test_a_deadlock_in_a_script_under_an_undecodable_folder_name_aborts_with_the_verdict(tmp_path):
    """Before: writing report.txt raised UnicodeEncodeError on the script's path; no verdict, no abort, a hang."""
    folder = os.path.join(os.fsencode(str(tmp_path)), b"caf\xe9")
    os.mkdir(folder)
    script = os.fsdecode(os.path.join(folder, b"hangs.py"))
    shutil.copy(os.path.join(SCENARIOS, "hangs.py"), script)
    reports = tmp_path / "reports"
    results = run_case([script, "collective_on_subset"], 2, reports, timeout=90, DDPWATCH_ACTION="abort")
    assert [r.returncode for r in results] == [3, 3], describe(results)
    assert any("collective_on_subset" in r.stderr and r"caf\xe9" in r.stderr for r in results), describe(results)
    [finding] = load_only_report(reports)["findings"]
    assert finding["kind"] == "collective_on_subset" and finding["location"]["file"] == script


# ---------------------------------------------------------------- `ddpwatch dump` and the CLI's error lines


@pytest.fixture
def own_registry(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    entry = {"pid": os.getpid(), "rank": 0, "world_size": 1, "job": "j\x1b]0;pwned\x07", "dir": str(tmp_path)}
    path = registry.register(entry)
    yield entry
    registry.unregister(path)


def test_dump_list_shows_a_ranks_text_visibly(own_registry, capsys):
    assert dump_client.list_ranks() == 0
    out = capsys.readouterr().out
    assert RAW.search(out) is None and r"j\x1b]0;pwned\x07" in out


def test_dump_prints_a_new_folder_named_by_someone_else_visibly(own_registry, capsys):
    """A shared report folder: whoever can write it names the folder `ddpwatch dump` prints."""
    planted = os.path.join(own_registry["dir"], "r\x1b[2J\rdone")

    def someone_writes_a_folder(signum, frame):
        os.mkdir(planted)
        with open(os.path.join(planted, "report.json"), "w") as handle:
            handle.write("{}")

    previous = signal.signal(signal.SIGUSR1, someone_writes_a_folder)
    try:
        assert dump_client.dump(pid=os.getpid(), wait=10) == 0
    finally:
        signal.signal(signal.SIGUSR1, previous)
    out = capsys.readouterr().out
    assert RAW.search(out) is None and out.endswith("r\\x1b[2J\\rdone\n")


def test_cli_settings_error_quoting_a_file_shows_escapes(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        config,
        "load",
        lambda **kw: (_ for _ in ()).throw(
            config.ConfigError("ddpwatch: cannot read /x/\x1b]0;pwned\x07setup.cfg: bad")
        ),
    )
    assert cli.main(["lint"]) == 2
    err = capsys.readouterr().err
    assert RAW.search(err) is None and r"/x/\x1b]0;pwned\x07setup.cfg" in err
