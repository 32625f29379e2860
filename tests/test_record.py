"""Recorder, call-site capture and stacks with fake tensors (anything with .shape and .dtype). No torch."""

import collections
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from ddpwatch.capture import record as R
from ddpwatch import frames  # noqa: E402
from ddpwatch.format import build, documents  # noqa: E402
from ddpwatch.capture.record import Recorder, tensor_meta  # noqa: E402
from ddpwatch.capture import sites  # noqa: E402
from ddpwatch.capture.sites import is_internal_file, user_frame  # noqa: E402
from ddpwatch.capture.stacks import python_stacks  # noqa: E402

HERE = os.path.abspath(__file__)
RECORD_KEYS = {
    "seq",
    "group",
    "op",
    "api",
    "p2p",
    "peer",
    "shapes",
    "dtypes",
    "site",
    "via",
    "region",
    "start",
    "age_s",
    "duration_s",
    "state",
    "error",
    "thread",
}
SNAPSHOT_KEYS = {
    "progress",
    "idle_s",
    "inflight",
    "recent",
    "last_seq",
    "groups",
    "ops_recorded",
    "ddp_steps",
    "site_counts",
    "p2p_counts",
    "recorder",
}


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class FakeTensor:
    def __init__(self, *shape, dtype="float32"):
        self.shape = shape
        self.dtype = FakeDtype(dtype)


class FakeWork:
    def __init__(self, done=False, error=None):
        self.done, self.error = done, error

    def is_completed(self):
        if self.error:
            raise self.error
        return self.done


def begin(recorder, op="all_reduce", group="0", tensors=None, peer=None, api=None):
    meta = tensor_meta(FakeTensor(8) if tensors is None else tensors)
    return recorder.begin(op, api or op, group, meta, sys._getframe(1), peer=peer)


def this_line():
    return sys._getframe(1).f_lineno


# ---------------------------------------------------------------- tensor metadata


def test_tensor_meta_of_fake_tensors():
    t = FakeTensor(2, 3, dtype="bfloat16")
    assert tensor_meta(t) == (((2, 3), t.dtype),)
    many = [FakeTensor(i + 1) for i in range(6)]
    assert [shape for shape, _ in tensor_meta(many)] == [(1,), (2,), (3,), (4,)]  # at most 4
    assert tensor_meta([FakeTensor(1), "not a tensor", FakeTensor(2)], limit=4)[1][0] == (2,)
    assert tensor_meta(None) == ()
    assert tensor_meta(3.0) == ()


def test_record_dict_describes_the_tensors_without_torch_prefix():
    rec = Recorder()
    r = rec.begin(
        "all_gather",
        "all_gather_into_tensor",
        "0",
        tensor_meta([FakeTensor(4, 5), FakeTensor(dtype="int64")]),
        sys._getframe(),
    )
    d = r.to_dict(r.start_mono + 1.5)
    assert set(d) == RECORD_KEYS
    assert d["shapes"] == [[4, 5], []]
    assert d["dtypes"] == ["float32", "int64"]
    assert d["age_s"] == 1.5
    assert (d["op"], d["api"], d["state"], d["duration_s"], d["p2p"], d["peer"]) == (
        "all_gather",
        "all_gather_into_tensor",
        build.IN_FLIGHT,
        None,
        False,
        None,
    )
    assert d["thread"] == threading.current_thread().name


# ---------------------------------------------------------------- begin / finish / in-flight set


def test_begin_and_finish_keep_the_inflight_set_right():
    rec = Recorder()
    a = begin(rec)
    b = begin(rec, op="broadcast")
    assert set(map(id, rec.inflight.values())) == {id(a), id(b)}
    assert (a.seq, b.seq) == (0, 1)
    assert rec.progress == 2
    rec.finish(a)
    assert list(rec.inflight.values()) == [b]
    assert a.state == build.COMPLETED and a.error is None
    rec.finish(b, RuntimeError("Timed out waiting 20000ms"))
    assert rec.inflight == {}
    assert b.state == build.FAILED
    assert b.error == "RuntimeError: Timed out waiting 20000ms"
    assert rec.progress == 4
    assert [r.seq for r in rec.ring] == [0, 1]
    d = b.to_dict(b.end_mono + 10)
    assert d["duration_s"] == round(b.end_mono - b.start_mono, 6)


def test_failure_text_is_bounded():
    rec = Recorder()
    r = begin(rec)
    rec.finish(r, RuntimeError("x" * 5000))
    assert len(r.error) == 500


def test_record_site_is_the_callers_line():
    rec = Recorder()
    line = this_line() + 1
    r = begin(rec)
    assert r.to_dict(0.0)["site"] == {"file": HERE, "line": line, "function": "test_record_site_is_the_callers_line"}
    assert not hasattr(r, "site_frame")  # no frame kept alive


def test_ring_is_bounded_after_10000_ops():
    rec = Recorder(ring_size=64)
    for _ in range(10_000):
        rec.finish(begin(rec))
    assert len(rec.ring) == 64
    assert [r.seq for r in rec.ring] == list(range(10_000 - 64, 10_000))
    assert rec.inflight == {}
    assert rec.last_seq == {"0": 9999}
    assert rec.progress == 20_000
    snap = rec.snapshot(recent=16)
    assert [r["seq"] for r in snap["recent"]] == list(range(10_000 - 16, 10_000))
    assert snap["inflight"] == []


def test_seq_counts_per_group_independently():
    rec = Recorder()
    seqs = [(g, begin(rec, group=g).seq) for g in ("0", "0", "1", "0", "1", "7")]
    assert seqs == [("0", 0), ("0", 1), ("1", 0), ("0", 2), ("1", 1), ("7", 0)]
    assert rec.last_seq == {"0": 2, "1": 1, "7": 0}


def test_point_to_point_seq_counts_per_peer_and_leaves_last_seq_alone():
    rec = Recorder()
    begin(rec, group="0")
    s1 = begin(rec, op="send", group="0", peer=1)
    s2 = begin(rec, op="send", group="0", peer=1)
    s3 = begin(rec, op="recv", group="0", peer=2)
    assert (s1.seq, s2.seq, s3.seq) == (0, 1, 0)
    assert begin(rec, group="0").seq == 1
    assert rec.last_seq == {"0": 1}
    d = s3.to_dict(s3.start_mono)
    assert (d["p2p"], d["peer"]) == (True, 2)


def test_void_gives_the_seq_back():
    rec = Recorder()
    for _ in range(5):
        rec.finish(begin(rec))
    voided = begin(rec, op="broadcast", api=build.DDP_BUCKET_REBUILD)
    assert voided.seq == 5
    assert rec.last_seq == {"0": 5}
    rec.void(voided)
    assert voided not in rec.ring
    assert rec.inflight == {}
    assert rec.last_seq == {"0": 4}
    assert begin(rec).seq == 5
    assert rec.last_seq == {"0": 5}


def test_void_of_the_first_op_forgets_the_group():
    rec = Recorder()
    rec.void(begin(rec, group="3"))
    assert rec.last_seq == {}
    assert begin(rec, group="3").seq == 0


def test_void_point_to_point():
    rec = Recorder()
    begin(rec, group="0")
    p = begin(rec, op="send", peer=1)
    rec.void(p)
    assert rec.last_seq == {"0": 0}
    assert begin(rec, op="send", peer=1).seq == 0


def test_regions_are_per_thread_and_land_in_records():
    rec = Recorder()
    where = build.site("/u/val.py", 42, "validate")
    seen_in_thread = []
    with rec.region((build.DDP_FORWARD, where, "DistributedDataParallel.forward", None)):
        inside = begin(rec, op="broadcast", api=build.DDP_BUFFER_BROADCAST)
        worker = threading.Thread(target=lambda: seen_in_thread.append(rec.current_region()))
        worker.start()
        worker.join()
    outside = begin(rec)
    assert seen_in_thread == [None]
    assert inside.to_dict(0.0)["region"] == {
        "kind": build.DDP_FORWARD,
        "site": where,
        "api": "DistributedDataParallel.forward",
    }
    assert outside.to_dict(0.0)["region"] is None
    assert rec.current_region() is None
    assert rec._regions == {}  # an emptied stack is dropped: threads that come and go leave nothing behind


def test_region_is_left_when_the_call_raises():
    rec = Recorder()
    with pytest.raises(ValueError):
        with rec.region(("ddp_forward", None, "DistributedDataParallel.forward", None)):
            raise ValueError("user's error")
    assert rec.current_region() is None and rec._regions == {}


def test_outermost_records_only_the_outer_call():
    from ddpwatch.capture.wrappers import Patcher

    rec = Recorder()
    patcher = Patcher(rec)
    calls = []
    inner = patcher._outermost(
        lambda: calls.append("inner passed through"), lambda args, kwargs, caller: calls.append("inner recorded")
    )
    outer = patcher._outermost(lambda: None, lambda args, kwargs, caller: (calls.append("outer recorded"), inner()))
    outer()
    inner()
    assert calls == ["outer recorded", "inner passed through", "inner recorded"]
    assert rec.busy == set()


def test_the_recorder_is_read_through_properties_and_changed_only_through_its_methods():
    rec = Recorder()
    for field in ("ring", "inflight", "progress", "progress_mono", "busy", "failure_hook"):
        with pytest.raises(AttributeError):
            setattr(rec, field, None)
    record = begin(rec)
    with pytest.raises(TypeError):
        rec.inflight[record] = None  # a read-only view: only finish()/void() take a record out
    rec.note_ddp_forward("pg")
    assert rec.take_pending_grad_sync() == "pg" and rec.take_pending_grad_sync() is None
    rec.note_group("g", [0, 1], True)
    assert rec.runs_on_host("g") and not rec.runs_on_host("h")
    assert rec.snapshot()["ddp_steps"] == 1 and rec.snapshot()["groups"]["g"] == [0, 1]
    rec.set_failure_hook(print)
    assert rec.failure_hook is print


def test_poll_pending_completes_finished_work():
    rec = Recorder()
    pending, finished, failed, plain = begin(rec), begin(rec), begin(rec), begin(rec)
    pending.work, finished.work, failed.work = FakeWork(False), FakeWork(True), FakeWork(error=RuntimeError("x"))
    rec.poll_pending()
    assert {id(r) for r in rec.inflight.values()} == {id(pending), id(plain)}
    assert (finished.state, failed.state, failed.error) == (build.COMPLETED, build.FAILED, "RuntimeError: x")
    assert finished.work is None


def test_sends_and_receives_are_counted_apart_per_peer_as_they_pair():
    rec = Recorder()
    rec.note_group("0", None, True)
    sends = [begin(rec, op="send", peer=1) for _ in range(3)]
    for record in sends:
        rec.finish(record)
    receive = begin(rec, op="recv", peer=1)
    assert [r.seq for r in sends] == [0, 1, 2] and receive.seq == 0  # recv #1 from rank 1 pairs with its send #1
    assert rec.snapshot()["p2p_counts"] == {"0:send:1": 3, "0:recv:1": 1}
    assert rec.last_seq == {}  # collectives' positions only


def test_snapshot_keys_and_contents(tmp_path):
    rec = Recorder()
    rec.note_group("0", None, False)
    rec.note_group("1", [0, 2], False)
    done = [begin(rec) for _ in range(3)]
    for r in done:
        rec.finish(r)
    waiting = begin(rec, op="barrier", tensors=[])
    snap = rec.snapshot(recent=2)
    assert set(snap) == SNAPSHOT_KEYS
    assert [r["seq"] for r in snap["recent"]] == [1, 2]
    assert [r["state"] for r in snap["recent"]] == [build.COMPLETED, build.COMPLETED]
    assert [r["seq"] for r in snap["inflight"]] == [waiting.seq] == [3]
    assert set(snap["inflight"][0]) == RECORD_KEYS
    assert snap["inflight"][0]["shapes"] == []
    assert snap["last_seq"] == {"0": 3}
    assert snap["groups"] == {"0": None, "1": [0, 2]}
    assert snap["progress"] == snap["ops_recorded"] == 7
    assert snap["idle_s"] >= 0
    snap["groups"]["2"] = None
    assert "2" not in rec.snapshot()["groups"]  # a copy
    (tmp_path / "snap.json").write_text(documents.dumps({"format_version": 1, **snap}), encoding="utf-8")
    loaded = documents.load_document(str(tmp_path / "snap.json"))
    assert loaded["inflight"] == snap["inflight"]


def test_snapshot_inflight_sorted_oldest_first():
    rec = Recorder()
    a, b = begin(rec, group="1"), begin(rec, group="0")
    b.start_mono, a.start_mono = a.start_mono - 5, a.start_mono
    assert [r["group"] for r in rec.snapshot()["inflight"]] == ["0", "1"]


def test_snapshot_with_recent_zero_has_no_history():
    rec = Recorder()
    for _ in range(5):
        rec.finish(begin(rec))
    assert rec.snapshot(recent=0)["recent"] == []


class _WatchedRing(collections.deque):
    """A ring that counts the passes over it from its oldest end (a full copy) and from its newest end."""

    forward = backward = 0

    def __iter__(self):
        type(self).forward += 1
        return super().__iter__()

    def __reversed__(self):
        type(self).backward += 1
        return super().__reversed__()


def test_snapshot_reads_the_newest_records_only_not_the_whole_ring():
    # The watchdog snapshots every round: copying a full ring (2,048 records) for its 8 recent ones was most of the
    # snapshot's time (benchmarks/attribution.py). The recent list is still the newest completed records, in order.
    rec = Recorder(ring_size=64)
    rec._ring = _WatchedRing(maxlen=64)
    for _ in range(100):
        rec.finish(begin(rec))
    waiting = begin(rec)
    _WatchedRing.forward = _WatchedRing.backward = 0
    snap = rec.snapshot(recent=8)
    assert _WatchedRing.forward == 0 and _WatchedRing.backward == 1
    assert [r["seq"] for r in snap["recent"]] == list(range(92, 100))
    assert [r["seq"] for r in snap["inflight"]] == [waiting.seq] == [100]


def test_a_finished_record_is_formatted_once_across_snapshots_and_only_its_age_moves(monkeypatch):
    # In a slow step the watchdog publishes the same recent records round after round: format each once.
    rec = Recorder()
    records = [begin(rec) for _ in range(3)]
    for r in records:
        rec.finish(r)
    formatted = []
    real = R.Record.to_dict
    monkeypatch.setattr(R.Record, "to_dict", lambda self, now: formatted.append(self.seq) or real(self, now))
    first = rec.snapshot(recent=8)["recent"]
    for r in records:
        r.start_mono -= 10.0  # ten seconds older, as if the next round came much later
    second = rec.snapshot(recent=8)["recent"]
    assert sorted(formatted) == [0, 1, 2]
    assert [d["age_s"] - f["age_s"] for d, f in zip(second, first)] == pytest.approx([10.0] * 3, abs=0.5)
    assert [{k: v for k, v in d.items() if k != "age_s"} for d in second] == [
        {k: v for k, v in d.items() if k != "age_s"} for d in first
    ]
    second[0]["flight_recorder"] = {"seq": 1}  # a reader adding to its copy changes no later snapshot
    assert "flight_recorder" not in rec.snapshot(recent=8)["recent"][0]
    records[0].state = build.FAILED  # a record whose state changed is formatted again
    assert rec.snapshot(recent=8)["recent"][0]["state"] == build.FAILED and formatted.count(0) == 2


def test_snapshot_refreshes_thread_names_only_when_the_threads_change(monkeypatch):
    # threading.enumerate() every round cost the watchdog for nothing: begin() names each thread the first time it
    # records, and a thread that came or went since the last look is found by the count of live threads.
    rec = Recorder()
    rec.finish(begin(rec))
    rec.snapshot()
    calls = []
    real = threading.enumerate
    monkeypatch.setattr(threading, "enumerate", lambda: calls.append(1) or real())
    for _ in range(5):
        rec.snapshot()
    assert calls == []
    started, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), release.wait(10)), name="late-thread")
    thread.start()
    try:
        started.wait(10)
        rec.snapshot()
        assert len(calls) == 1 and R._thread_names[thread.ident] == "late-thread"
    finally:
        release.set()
        thread.join(10)


# ---------------------------------------------------------------- whose line is it


def test_is_internal_file():
    assert is_internal_file(os.__file__) is True
    assert is_internal_file(threading.__file__) is True
    assert is_internal_file(R.__file__) is True  # ddpwatch itself
    assert is_internal_file("<frozen importlib._bootstrap>") is True
    assert is_internal_file("<string>") is True
    assert is_internal_file(HERE) is False
    assert is_internal_file("/u/train.py") is False
    assert is_internal_file(os.path.join(frames.PACKAGE_DIR, "examples", "seed.py")) is False  # plays the user
    stdlib = frames.THIS_MACHINE.stdlib_prefixes[0]
    # an installed framework is library code: never the user's line
    assert is_internal_file(os.path.join(stdlib, "site-packages", "lightning", "trainer.py")) is True
    assert sites.file_kind(os.path.join(stdlib, "site-packages", "lightning", "trainer.py")) == sites.LIBRARY
    assert sites.file_kind("/venv/lib/python3.11/dist-packages/accelerate/state.py") == sites.LIBRARY


@pytest.mark.parametrize(
    "path",
    [
        "/venv/lib/python3.11/site-packages/lightning/pytorch/strategies/ddp.py",
        "/usr/lib/python3/dist-packages/accelerate/accelerator.py",
        "/home/u/project/train.py",
        "<frozen runpy>",
    ],
)
def test_a_frame_is_classified_the_same_live_and_offline(path):
    """A Lightning frame was "via lightning" live but the user's line in a Flight Recorder dump: one classifier now."""
    from ddpwatch.sources import flight_recorder

    dumped = flight_recorder._frame({"filename": path, "line": 1, "name": "f"})
    assert dumped["internal"] is is_internal_file(path)
    assert frames.classify(path, None, frames.DUMPED) == sites.file_kind(path)


def test_configured_packages_move_frames_between_user_and_library():
    try:
        sites.configure_frames(user_packages=("mylab",), library_packages=("trainkit",))
        assert sites.file_kind("/venv/lib/python3.11/site-packages/mylab/train.py") == sites.USER
        assert sites.file_kind("/src/trainkit/loop.py", "trainkit.loop") == sites.LIBRARY
        assert sites.file_kind("/src/other/loop.py", "other.loop") == sites.USER
    finally:
        sites.configure_frames()
    assert sites.file_kind("/venv/lib/python3.11/site-packages/mylab/train.py") == sites.LIBRARY


def test_a_file_kind_remembered_for_dumped_frames_follows_the_configured_packages():
    # is_internal_file remembers each file's answer (a Flight Recorder read asks for thousands of frames): a
    # configuration that moves a package between the user's and a library's must not meet a stale answer
    path = "/venv/lib/python3.11/site-packages/mylab/train.py"
    assert is_internal_file(path) is True and is_internal_file(path) is True  # asked twice: the second remembered
    try:
        sites.configure_frames(user_packages=("mylab",))
        assert is_internal_file(path) is False
    finally:
        sites.configure_frames()
    assert is_internal_file(path) is True


def test_user_frame_steps_over_library_frames_and_names_the_library_call():
    namespace = {}
    library_file = "/venv/lib/python3.11/site-packages/trainkit/strategy.py"
    exec(
        compile("def barrier(probe):\n    return probe(__import__('sys')._getframe())\n", library_file, "exec"),
        namespace,
    )
    frame, via = namespace["barrier"](sites.user_frame_and_via)
    assert frame.f_code.co_name == "test_user_frame_steps_over_library_frames_and_names_the_library_call"
    assert sites.via_site(via)[2:] == ("barrier", "trainkit")


def test_user_frame_skips_internal_frames():
    namespace = {}
    # A function whose code claims to live in os.py: a standard-library frame between us and the recorder.
    exec(compile("import sys\ndef call(fn):\n    return fn(sys._getframe())\n", os.__file__, "exec"), namespace)
    line = this_line() + 1
    found, where = namespace["call"](lambda frame: (user_frame(frame), sites.frame_site(user_frame(frame))))
    assert found is sys._getframe()
    assert where == {"file": __file__, "line": line, "function": "test_user_frame_skips_internal_frames"}


def test_user_frame_of_a_user_frame_is_itself():
    here = sys._getframe()
    assert user_frame(here) is here
    assert user_frame(None) is None
    assert sites.frame_site(None) is None
    namespace = {}
    exec(compile("import sys\ndef top():\n    return sys._getframe()\n", os.__file__, "exec"), namespace)
    assert user_frame(namespace["top"]()) is here  # the internal frame is skipped, its caller (this test) found


def test_python_stacks_main_thread_first():
    started, release = threading.Event(), threading.Event()

    def park():
        started.set()
        release.wait(5)

    # The name sorts before "MainThread": the main thread must still come first.
    worker = threading.Thread(target=park, name="AAA-worker", daemon=True)
    worker.start()
    started.wait(5)
    try:
        stacks = python_stacks()
        skipped = python_stacks(skip_thread=worker.ident)
    finally:
        release.set()
        worker.join(5)
    assert stacks[0]["main"] is True
    assert stacks[0]["thread"] == threading.main_thread().name
    assert [s["main"] for s in stacks].count(True) == 1
    assert "AAA-worker" in [s["thread"] for s in stacks]
    assert "AAA-worker" not in [s["thread"] for s in skipped]
    main = stacks[0]["frames"]
    assert set(main[-1]) == {"file", "line", "function", "internal"}
    assert main[-1]["function"] == "python_stacks" and main[-1]["internal"] is True  # innermost last
    mine = [f for f in main if f["function"] == "test_python_stacks_main_thread_first"]
    assert len(mine) == 1 and mine[0]["internal"] is False and mine[0]["file"] == __file__
    worker_stack = next(s for s in stacks if s["thread"] == "AAA-worker")
    assert any(f["function"] == "park" for f in worker_stack["frames"])
    assert len(python_stacks(limit=3)[0]["frames"]) == 3


def test_in_flight_set_is_bounded_when_work_never_completes():
    rec = Recorder(ring_size=16)
    records = [begin(rec) for _ in range(100)]  # never finished: a backend whose Work never says done
    assert len(rec.inflight) == 16
    assert [r.state for r in records[:84]] == [build.UNTRACKED] * 84
    assert all(r.state == build.IN_FLIGHT for r in records[84:])


def test_code_made_anew_each_step_does_not_grow_the_code_caches(monkeypatch):
    """A function compiled per step (exec, generated code) is a new code object each time: the caches stay bounded,
    the ring's records still name their lines, and the site counts still count every call by line."""
    monkeypatch.setattr(sites, "CODE_LIMIT", 16)
    recorder = Recorder(ring_size=8)
    for step in range(200):
        namespace = {}
        source = f"def step(record):\n    return record(__import__('sys')._getframe())  # step {step}\n"
        exec(compile(source, "/u/gen.py", "exec"), namespace)  # a new code object each step
        namespace["step"](lambda frame: recorder.finish(recorder.begin("barrier", "barrier", "0", (), frame)))
    assert len(sites._code_by_id) <= 16 and len(sites.kind_of_code) <= 16
    snap = recorder.snapshot(recent=8)
    assert snap["site_counts"] == {"/u/gen.py:2": 200}
    assert [(r["site"]["file"], r["site"]["line"]) for r in snap["recent"]] == [("/u/gen.py", 2)] * 8


def test_an_ended_threads_name_moves_aside_so_that_a_thread_reusing_its_ident_is_named_afresh(monkeypatch):
    """Thread idents are reused: a stale ident -> name entry made a new thread's records read under an ended one's
    name (test_guard's side-thread read as ddpwatch-signals, after other tests' threads ended)."""
    ended = max(t.ident for t in threading.enumerate()) + 12345  # no live thread has it
    monkeypatch.setitem(R._thread_names, ended, "ended-thread")
    Recorder()  # a recording begins: the names are refreshed
    assert ended not in R._thread_names  # begin() names the next thread to have this ident, whatever it is called
    assert R._thread_name(ended) == "ended-thread"  # the ended thread's own records still name it
    R._ended_names.pop(ended, None)
