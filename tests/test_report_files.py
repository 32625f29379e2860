"""report.write_incident / load_incident on disk, and snapshot's format checks. No torch."""

import copy
import json
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import incident, seed_states  # noqa: E402
from ranks import ROOT  # noqa: E402

from ddpwatch import analysis, private
from ddpwatch.render import report  # noqa: E402
from ddpwatch.format import documents, upgrade, version as V  # noqa: E402
from ddpwatch.format.version import FORMAT_VERSION, FormatError, check_version  # noqa: E402

RUN_ID = "20250101-120000-job7"


def seed_incident(world_size=2, run_id=RUN_ID):
    st = seed_states(world_size)
    return incident(st, analysis.assess(st, world_size, 2.0, 300.0).findings, run_id=run_id)


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """Point tempfile (the fallback location) into tmp_path, so no test writes into the real /tmp."""
    fallback = tmp_path / "systemp"
    fallback.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(fallback))
    return fallback


def test_write_incident_writes_every_kind_of_file(tmp_path, temp_dir):
    doc = seed_incident(3)
    folder, note = documents.save_incident(str(tmp_path / "reports"), RUN_ID, doc, report.renderings)
    assert note == ""
    assert folder == str(tmp_path / "reports" / RUN_ID)
    assert sorted(os.listdir(folder)) == [
        "rank-0.json",
        "rank-1.json",
        "rank-2.json",
        "report.html",
        "report.json",
        "report.txt",
        "trace.json",
    ]
    assert doc["report_dir"] == os.path.abspath(folder)
    for rank in range(3):
        state = documents.load_document(os.path.join(folder, f"rank-{rank}.json"))
        assert state == doc["ranks"][rank]
    with open(os.path.join(folder, "report.txt"), encoding="utf-8") as handle:
        text = handle.read()
    assert "[ddp_forward_on_subset] culprit: rank 0 at val.py:42" in text
    assert f"Report files: {os.path.abspath(folder)}" in text
    assert os.listdir(temp_dir) == []


def test_second_incident_with_the_same_run_id_gets_a_suffix(tmp_path, temp_dir):
    base = str(tmp_path / "reports")
    first, _ = documents.save_incident(base, RUN_ID, seed_incident(), report.renderings)
    second, note = documents.save_incident(base, RUN_ID, seed_incident(), report.renderings)
    third, _ = documents.save_incident(base, RUN_ID, seed_incident(), report.renderings)
    assert note == ""
    assert os.path.basename(first) == RUN_ID
    assert os.path.basename(second) == RUN_ID + "-2"
    assert os.path.basename(third) == RUN_ID + "-3"
    assert documents.load_incident(second)["report_dir"] == os.path.abspath(second)
    assert sorted(os.listdir(base)) == [RUN_ID, RUN_ID + "-2", RUN_ID + "-3"]  # no .incoming- folder left behind


def test_no_staging_folder_left_behind_on_failure(tmp_path, temp_dir, monkeypatch):
    base = tmp_path / "reports"

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(private, "write_new_file", broken)  # every file ddpwatch creates goes through it
    with pytest.raises(OSError):
        documents.save_incident(str(base), RUN_ID, seed_incident(), report.renderings)
    assert os.listdir(base) == []
    assert [name for name in os.listdir(documents.fallback_dir()) if name.startswith(".incoming-")] == []


def test_incident_folder_gets_umask_permissions_not_mkdtemp_ones(tmp_path, temp_dir):
    old = os.umask(0o022)
    try:
        folder, _ = documents.save_incident(str(tmp_path), RUN_ID, seed_incident(), report.renderings)
    finally:
        os.umask(old)
    assert os.stat(folder).st_mode & 0o777 == 0o755


def test_unsafe_run_id_is_made_a_safe_folder_name(tmp_path, temp_dir):
    folder, _ = documents.save_incident(str(tmp_path), "../a b/c", seed_incident(), report.renderings)
    assert os.path.dirname(folder) == str(tmp_path)
    assert os.path.basename(folder) == "..-a-b-c"


def test_unwritable_base_falls_back_to_the_temp_dir(tmp_path, temp_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    base = str(blocker / "reports")
    doc = seed_incident()
    folder, note = documents.save_incident(base, RUN_ID, doc, report.renderings)
    assert folder == os.path.join(documents.fallback_dir(), RUN_ID)
    assert documents.fallback_dir() == str(temp_dir / f"ddpwatch-{os.getuid()}" / "reports")
    assert os.path.isfile(os.path.join(folder, "report.json"))
    assert base in note
    assert folder in note
    assert note.startswith("could not write under ")
    assert doc["report_dir"] == os.path.abspath(folder)
    assert blocker.read_text() == "not a folder"


def test_load_incident_reads_it_back(tmp_path, temp_dir):
    doc = seed_incident(3)
    original = copy.deepcopy(doc)
    folder, _ = documents.save_incident(str(tmp_path), RUN_ID, doc, report.renderings)
    loaded = documents.load_incident(folder)
    assert loaded["report_dir"] == os.path.abspath(folder)
    loaded.pop("report_dir")
    assert loaded == original
    # The report.json path works too.
    assert documents.load_incident(os.path.join(folder, "report.json")) == doc


def test_load_incident_rejects_other_versions(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"format_version": 99, "ranks": []}))
    with pytest.raises(FormatError, match="format_version 99"):
        documents.load_incident(str(tmp_path))


def _loaded(tmp_path, text: str) -> dict:
    """`text` read as `ddpwatch report` reads a file (documents.load_document)."""
    (tmp_path / "x.json").write_text(text, encoding="utf-8")
    return documents.load_document(str(tmp_path / "x.json"))


def test_load_document_rejects_a_wrong_format_version(tmp_path):
    with pytest.raises(FormatError, match="format_version 2 is not one this ddpwatch reads"):
        _loaded(tmp_path, '{"format_version": 2}')
    with pytest.raises(FormatError, match="format_version None"):
        _loaded(tmp_path, '{"rank": 0}')
    with pytest.raises(FormatError, match="format_version '1'"):
        _loaded(tmp_path, '{"format_version": "1"}')


@pytest.mark.parametrize("text", ["{not json", "", '{"format_version": 1', "[1, 2"])
def test_load_document_rejects_bad_json(tmp_path, text):
    with pytest.raises(FormatError, match=r"x\.json: not a ddpwatch report\.json or rank-<r>\.json \(JSONDecodeError"):
        _loaded(tmp_path, text)


@pytest.mark.parametrize("text", ["[]", "1", '"text"', "null"])
def test_load_document_rejects_non_objects(tmp_path, text):
    with pytest.raises(FormatError, match=r"x\.json: not a ddpwatch report\.json or rank-<r>\.json \(JSON \w+, not an"):
        _loaded(tmp_path, text)


def test_format_error_is_a_value_error(tmp_path):
    assert issubclass(FormatError, ValueError)
    assert _loaded(tmp_path, '{"format_version": 1, "a": [1]}') == {"format_version": 1, "a": [1]}


def test_html_and_trace_files_are_whole_renderings(tmp_path, temp_dir):
    doc = seed_incident(2)
    folder, _ = documents.save_incident(str(tmp_path), RUN_ID, doc, report.renderings)
    with open(os.path.join(folder, "report.html"), encoding="utf-8") as handle:
        page = handle.read()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert 'id="divergence"' in page
    with open(os.path.join(folder, "trace.json"), encoding="utf-8") as handle:
        trace = json.load(handle)
    assert {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"} == {"rank 0", "rank 1"}


def test_a_renderer_bug_costs_only_its_own_file(tmp_path, temp_dir, monkeypatch):
    import ddpwatch.render.html as html_report

    def broken(incident):
        raise RuntimeError("renderer bug")

    monkeypatch.setattr(html_report, "render_html", broken)
    folder, _ = documents.save_incident(str(tmp_path), RUN_ID, seed_incident(), report.renderings)
    with open(os.path.join(folder, "report.html"), encoding="utf-8") as handle:
        page = handle.read()
    assert "could not render" in page and "renderer bug" in page
    assert documents.load_incident(folder)["findings"][0]["kind"] == "ddp_forward_on_subset"
    with open(os.path.join(folder, "report.txt"), encoding="utf-8") as handle:
        assert "[ddp_forward_on_subset] culprit: rank 0" in handle.read()


class FakeTensor:
    """Quacks like a tensor that slipped into a record by mistake; its data must never reach a report."""

    shape = (2, 3)
    dtype = "float32"

    def __repr__(self):
        return "tensor([[0.1234, 0.5678, 0.9999], ...])"


def test_no_tensor_contents_reach_any_file(tmp_path, temp_dir):
    doc = seed_incident(2)
    doc["ranks"][0]["inflight"][0]["oops"] = FakeTensor()
    folder, _ = documents.save_incident(str(tmp_path), RUN_ID, doc, report.renderings)
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), encoding="utf-8") as handle:
            text = handle.read()
        assert "0.1234" not in text, name
    oops = documents.load_incident(folder)["ranks"][0]["inflight"][0]["oops"]
    assert oops == "<FakeTensor shape=[2, 3] dtype=float32>"


def test_load_incident_refuses_a_rank_snapshot(tmp_path, temp_dir):
    folder, _ = documents.save_incident(str(tmp_path), RUN_ID, seed_incident(), report.renderings)
    with pytest.raises(FormatError, match="not a ddpwatch incident"):
        documents.load_incident(os.path.join(folder, "rank-0.json"))


def test_upgrade_hook_brings_old_versions_to_the_current_one(monkeypatch):
    """The loader reads every version written: each older version has an upgrade step to the next."""
    monkeypatch.setattr(V, "READABLE_VERSIONS", (0, 1))
    monkeypatch.setitem(upgrade.UPGRADES, 0, lambda doc: dict(doc, format_version=1, findings=doc["problems"]))
    old = {"format_version": 0, "ranks": [], "problems": []}
    assert upgrade.upgrade(check_version(old, "x")) == {
        "format_version": 1,
        "ranks": [],
        "problems": [],
        "findings": [],
    }
    assert not upgrade.UPGRADES.get(FORMAT_VERSION), "the current version needs no upgrade"


def test_every_readable_version_has_an_upgrade_path():
    for version in V.READABLE_VERSIONS:
        assert version == FORMAT_VERSION or version in upgrade.UPGRADES, version


@pytest.mark.real
def test_the_report_modules_import_no_torch():
    """A saved incident is re-rendered anywhere, torch installed or not."""
    import subprocess

    modules = [
        "render",
        "render.report",
        "render.html",
        "render.trace",
        "sources.report_command",
        "sources.merge",
        "sources.flight_recorder",
        "format.documents",
        "analysis.incident",
        "cli",
    ]
    code = "import sys; " + "; ".join(f"import ddpwatch.{m}" for m in modules) + "; sys.exit('torch' in sys.modules)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60).returncode == 0


def test_a_new_output_format_is_one_table_row_and_one_function(tmp_path, temp_dir, monkeypatch, capsys):
    """docs/contributing.md's recipe, followed with a toy format: offered by --format, written in every folder."""
    from ddpwatch import cli

    def render_toy(doc: dict) -> str:  # the one function: plain data in, text out
        return f"toy report of {doc['run_id']}\n"

    monkeypatch.setitem(report.RENDERERS, "toy", ("report.toy", render_toy, str))  # the one row
    assert "toy" in cli.report_formats()
    folder, _ = documents.save_incident(str(tmp_path / "reports"), RUN_ID, seed_incident(), report.renderings)
    assert open(os.path.join(folder, "report.toy"), encoding="utf-8").read() == f"toy report of {RUN_ID}\n"
    out = tmp_path / "out.toy"
    assert cli.main(["report", folder, "--format", "toy", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == f"toy report of {RUN_ID}\n"
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []  # no temp file left


def test_a_failed_output_file_leaves_no_temp_file_and_the_old_file_whole(tmp_path, monkeypatch):
    from ddpwatch import atomic

    target = tmp_path / "report.txt"
    target.write_text("old\n")

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(private, "write_new_file", broken)
    with pytest.raises(OSError):
        atomic.write_path(str(target), b"new\n")
    assert os.listdir(tmp_path) == ["report.txt"]
    assert target.read_text() == "old\n"


# ----- `-o PATH` and every file ddpwatch writes: a rename replaces only a regular file (issue 27 item 2) -----


def written_report(tmp_path, temp_dir):
    folder, _ = documents.save_incident(str(tmp_path / "reports"), RUN_ID, seed_incident(), report.renderings)
    return folder


def test_o_writes_through_a_symlink_and_keeps_it(tmp_path, temp_dir):
    # Before: the temp file was renamed over the link; the link became a regular file, its target never written.
    from ddpwatch import cli

    folder = written_report(tmp_path, temp_dir)
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old")
    link.symlink_to(target)
    assert cli.main(["report", folder, "--format", "json", "-o", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["run_id"] == RUN_ID


def test_o_writes_through_a_fifo_as_any_tool_does(tmp_path, temp_dir):
    import threading

    from ddpwatch import cli

    folder = written_report(tmp_path, temp_dir)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    assert cli.main(["report", folder, "--format", "json", "-o", str(fifo)]) == 0
    reader.join(10)
    assert json.loads(got[0])["run_id"] == RUN_ID
    assert stat_kind(fifo) == "fifo"


def stat_kind(path):
    import stat

    mode = os.lstat(path).st_mode
    return (
        "fifo"
        if stat.S_ISFIFO(mode)
        else "link"
        if stat.S_ISLNK(mode)
        else "char"
        if stat.S_ISCHR(mode)
        else "regular"
        if stat.S_ISREG(mode)
        else "other"
    )


@pytest.mark.real
def test_o_to_a_link_to_standard_output_prints_the_report(tmp_path, temp_dir):
    """What `-o /dev/stdout` is (a root-owned link to /proc/self/fd/1), made in a folder of the test's own."""
    import subprocess

    folder = written_report(tmp_path, temp_dir)
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    done = subprocess.run(
        [sys.executable, "-m", "ddpwatch", "report", folder, "--format", "json", "-o", str(link)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["run_id"] == RUN_ID and stat_kind(link) == "link"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_o_to_a_character_device_writes_to_the_device_and_keeps_it(tmp_path, temp_dir):
    """A null device of the test's own (as root, `-o /dev/null` replaced the machine's /dev/null before)."""
    import stat

    from ddpwatch import cli

    folder = written_report(tmp_path, temp_dir)
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert cli.main(["report", folder, "-o", str(null)]) == 0
    assert stat_kind(null) == "char" and os.stat(null).st_rdev == os.makedev(1, 3)


def test_a_regular_file_or_a_new_name_is_still_replaced_whole(tmp_path, temp_dir):
    from ddpwatch import atomic

    path = tmp_path / "out.txt"
    atomic.write_path(str(path), b"one")
    inode = os.stat(path).st_ino
    atomic.write_path(str(path), b"two")
    assert path.read_bytes() == b"two" and os.stat(path).st_ino != inode  # a new file, renamed into place


def test_the_watchdogs_files_never_wait_on_a_fifo(tmp_path):
    from ddpwatch import atomic

    os.mkfifo(tmp_path / "rank-0.json")  # no reader: the watchdog's write fails at once instead of waiting
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            atomic.write_file(fd, "rank-0.json", b"{}")
        assert stat_kind(tmp_path / "rank-0.json") == "fifo"
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="a symlink of another user needs root to make (lchown)")
def test_a_symlink_of_another_user_is_replaced_never_followed(tmp_path):
    """In a shared folder someone else's link under a name ddpwatch writes is theirs: its target is never written."""
    from ddpwatch import atomic

    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "rank-0.json"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        atomic.write_file(fd, "rank-0.json", b"{}")
    finally:
        os.close(fd)
    assert victim.read_text() == "precious" and stat_kind(link) == "regular" and link.read_bytes() == b"{}"
