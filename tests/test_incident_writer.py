"""The incident folder is written once (issue 29 part 2): the verdict is said before py-spy reads this process (it
pauses the process it reads), the folder after, with every rank's native stacks; hand-built states, a fake store and
a fake py-spy, no process."""

import collections
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))

from factory import seed_states  # noqa: E402

from ddpwatch import analysis, atomic  # noqa: E402
from ddpwatch.config import Config  # noqa: E402
from ddpwatch.watch import evidence, incident_writer  # noqa: E402
from ddpwatch.watch.incident_writer import IncidentWriter  # noqa: E402


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


class FakeJob:
    """The store protocol as the writer uses it: every rank answers at once, rank 1 with its native stacks."""

    def __init__(self, states: dict):
        self.states = states
        self.posted: dict = {}

    def open_incident(self, info: dict) -> int:
        return 1

    def contribute(self, number: int, rank: int, doc: dict) -> None:
        self.states[rank] = doc

    def collect(self, number: int, deadline: float, answering: int) -> dict:
        return dict(self.states)

    def with_history(self, views: dict) -> dict:
        return views

    def natives(self, number: int, ranks) -> dict:
        assert 0 not in ranks  # the leader reads its own: never asked of the store
        return {rank: native("peer_wait") for rank in ranks}

    def post_verdict(self, number: int, verdict: dict) -> None:
        self.posted[number] = verdict


class OwnAnswer:
    def __init__(self, job: FakeJob, state: dict):
        self.job, self.state = job, state

    def own(self, number: int, since=None) -> None:
        self.job.contribute(number, 0, self.state)


class Policy:
    def __init__(self, events: list):
        self.events = events

    def verdict_out(self, incident: dict, action: str) -> None:
        self.events.append("verdict out")

    def report_written(self, incident: dict, action: str) -> None:
        self.events.append("report written")


def write_one(tmp_path, monkeypatch, stopping: bool = False):
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
    job = FakeJob({1: states[1]})
    stop = threading.Event()
    if stopping:
        stop.set()
    writer = IncidentWriter(
        job,
        Config(dir=str(tmp_path)),
        0,
        2,
        states[0]["host"],
        "t",
        answers=OwnAnswer(job, states[0]),
        policy=Policy(events),
        logged=set(),
        stopping=stop,
    )
    folder, number, action = writer.write(analysis.Assessment(analysis.DUMP, [], "dump-0-1"), None, {}, "report")
    assert action == "report"
    assert job.posted[number]["folder"] == folder
    return events, written, folder


def test_the_folder_is_written_once_after_the_verdict_with_every_ranks_native_stacks(tmp_path, monkeypatch):
    events, written, folder = write_one(tmp_path, monkeypatch)
    assert events == ["verdict", "verdict out", f"py-spy {os.getpid()}", "report line", "report written"]
    assert set(written) == {"rank-0.json", "rank-1.json", "report.json", "report.txt", "report.html", "trace.json"}
    assert set(written.values()) == {1}  # each file once: no second pass rewrites the folder
    assert sorted(os.listdir(folder)) == sorted(written)
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as handle:
        ranks = {state["rank"]: state for state in json.load(handle)["ranks"]}
    assert ranks[0]["native"] == native("own_wait") and ranks[1]["native"] == native("peer_wait")
    with open(os.path.join(folder, "rank-1.json"), encoding="utf-8") as handle:
        assert json.load(handle)["native"] == native("peer_wait")


def test_a_process_on_its_way_out_writes_the_folder_once_without_waiting_for_native_stacks(tmp_path, monkeypatch):
    events, written, folder = write_one(tmp_path, monkeypatch, stopping=True)
    assert events == ["verdict", "verdict out", "report line", "report written"]  # py-spy never started
    assert set(written.values()) == {1} and "report.json" in written
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as handle:
        assert not any("native" in state for state in json.load(handle)["ranks"])
