"""The incident folder is written once (issue 29 part 2): the verdict is said, then the report files are written, and
only then does py-spy read this process (it pauses the process it reads): every rank's native stacks go into the
folder's native.json (issue 43 item 5: the report on disk within a second); hand-built states, a fake store and a
fake py-spy, no process."""

import collections
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))

from factory import seed_states  # noqa: E402
from writer_fakes import OwnAnswer, Policy, StoreJob  # noqa: E402

from ddpwatch import analysis, atomic  # noqa: E402
from ddpwatch.config import Config  # noqa: E402
from ddpwatch.format import documents  # noqa: E402
from ddpwatch.watch import evidence, incident_writer  # noqa: E402
from ddpwatch.watch.incident_writer import IncidentWriter, RankIdentity  # noqa: E402


def native(function: str) -> dict:
    return {
        "threads": [
            {
                "thread": "MainThread",
                "active": True,
                "owns_gil": False,
                "frames": [{"function": function, "file": "libgloo.so", "line": 0}],
            }
        ]
    }


def native_stacks_of_peers(ranks) -> dict:
    """Every rank asked answers with its native stacks (rank 1 waits in gloo); the leader reads its own."""
    assert 0 not in ranks  # the leader reads its own: never asked of the store
    return {rank: native("peer_wait") for rank in ranks}


def write_one(tmp_path, monkeypatch, stopping: bool = False, native_stacks: bool = True):
    """One incident led by rank 0 of 2; returns (events, {file name: times written}, folder)."""
    events: list = []
    said = threading.Event()
    written: collections.Counter = collections.Counter()

    def say(text: str) -> None:
        events.append("report line" if "report written to" in text else "verdict")
        said.set()

    def py_spy(pid: int, *args, **kwargs) -> dict:
        events.append(f"py-spy {pid}" if said.is_set() else f"py-spy {pid} before the verdict")
        return native("own_wait")

    write_new_files = atomic.write_new_files

    def counted(folder_fd: int, files: dict) -> None:
        written.update(files.keys())
        write_new_files(folder_fd, files)

    monkeypatch.setattr(incident_writer, "say", say)
    monkeypatch.setattr(evidence, "native_stacks", py_spy)
    monkeypatch.setattr(atomic, "write_new_files", counted)
    states = seed_states(2)
    job = StoreJob({1: states[1]}, natives=native_stacks_of_peers)
    stop = threading.Event()
    if stopping:
        stop.set()
    writer = IncidentWriter(
        job,
        Config(dir=str(tmp_path), native_stacks=native_stacks),
        RankIdentity(0, 2, states[0]["host"], "t"),
        answers=OwnAnswer(job, states[0]),
        policy=Policy(events),
        logged=set(),
        stopping=stop,
    )
    folder, number, action = writer.write(analysis.Assessment(analysis.DUMP, [], "dump-0-1"), None, {}, "report")
    assert action == "report"
    assert job.posted[number]["folder"] == folder
    return events, written, folder


def test_the_report_files_are_written_once_before_py_spy_and_the_native_stacks_go_to_native_json(tmp_path, monkeypatch):
    events, written, folder = write_one(tmp_path, monkeypatch)
    assert events == ["verdict", "verdict out", "report line", f"py-spy {os.getpid()}", "report written"]
    assert set(written) == {"rank-0.json", "rank-1.json", "report.json", "report.txt", "report.html", "trace.json"}
    assert set(written.values()) == {1}  # each file once: no second pass rewrites the folder
    assert sorted(os.listdir(folder)) == sorted([*written, "native.json"])
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as handle:
        assert not any("native" in state for state in json.load(handle)["ranks"])  # written before py-spy ran
    with open(os.path.join(folder, "native.json"), encoding="utf-8") as handle:
        natives = json.load(handle)
    assert natives["ranks"] == {"0": native("own_wait"), "1": native("peer_wait")}
    loaded = {state["rank"]: state for state in documents.load_incident(folder)["ranks"]}
    assert loaded[0]["native"] == native("own_wait") and loaded[1]["native"] == native("peer_wait")


def test_a_native_json_of_another_run_or_malformed_is_left_out_and_the_report_still_reads(tmp_path, monkeypatch):
    _, _, folder = write_one(tmp_path, monkeypatch)
    path = os.path.join(folder, "native.json")
    with open(path, encoding="utf-8") as handle:
        doc = json.load(handle)
    for text in (json.dumps(dict(doc, run_id="another-run")), "{not json", json.dumps({"ranks": []}), "[]"):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        assert not any("native" in state for state in documents.load_incident(folder)["ranks"]), text


def test_a_process_on_its_way_out_writes_the_folder_once_without_waiting_for_native_stacks(tmp_path, monkeypatch):
    events, written, folder = write_one(tmp_path, monkeypatch, stopping=True)
    assert events == ["verdict", "verdict out", "report line", "report written"]  # py-spy never started
    assert set(written.values()) == {1} and "report.json" in written
    assert "native.json" not in os.listdir(folder)
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as handle:
        assert not any("native" in state for state in json.load(handle)["ranks"])


def test_native_stacks_off_writes_the_folder_once_and_runs_no_py_spy(tmp_path, monkeypatch):
    events, written, folder = write_one(tmp_path, monkeypatch, native_stacks=False)
    assert events == ["verdict", "verdict out", "report line", "report written"]  # py-spy never started
    assert set(written.values()) == {1} and "native.json" not in os.listdir(folder)


def test_a_peer_with_native_stacks_off_says_so_at_once_and_runs_no_py_spy():
    """What a peer sends for an incident it is asked about: with the option off, one line (so a leader that reads its
    own does not wait for this rank's), and py-spy never runs; with it on, its own read."""
    from ddpwatch.watch.answers import Answers

    class Job:
        def __init__(self):
            self.natives: dict = {}

        def contribute_native(self, number, rank, doc):
            self.natives[(number, rank)] = doc

    reads: list = []
    for native_on in (False, True):
        job = Job()
        answers = Answers(job, 1, states=None, native=lambda pid: reads.append(pid) or native("x"), native_on=native_on)
        answers.peer_native(7, needed=True)
        expected = native("x") if native_on else {"unavailable": "native_stacks is off on this rank"}
        assert job.natives[(7, 1)] == expected
    assert reads == [os.getpid()]  # only the arm with the option on read its stacks
