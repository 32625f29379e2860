"""The flight recorder (watch/flight.py) on hand-built Flight Recorder entries: what is in flight, where, and when
the feed looks; the Patcher's per-op switch; the Recorder's side of the feed. No process, no sleep."""

import sys
import threading

import pytest
import torch.distributed  # noqa: F401 - imported at collection: its first import runs ldconfig, a process

from ddpwatch import analysis, flight_entries
from ddpwatch.capture.record import FLIGHT, Recorder
from ddpwatch.config import Config
from ddpwatch.capture.replacements import PATCH_MARKER
from ddpwatch.format import build
from ddpwatch.watch import flight, flight_support


def entry(record_id, seq, op="all_reduce", retired=True, group="0", thread=None, sizes=((4,),), p2p=False):
    """One entry as torch 2.13's _dump_fr_trace writes it (thread_id as text, sizes as lists)."""
    return {
        "record_id": record_id,
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{op}",
        "process_group": (group, "default_pg"),
        "thread_id": str(thread or threading.get_ident()),
        "retired": retired,
        "state": "scheduled",  # gloo: the state never moves, `retired` does
        "input_sizes": [list(size) for size in sizes],
        "input_dtypes": ["Float"] * len(sizes),
        "time_created_ns": 1_700_000_000_000_000_000 + record_id,
        "is_p2p": p2p,
    }


def test_in_flight_is_unretired_and_newer_than_every_retired_op_of_its_group():
    entries = [
        entry(0, 1, retired=False),  # an async op nobody waited on: never retired on gloo, not in flight
        entry(1, 2),
        entry(2, 3, retired=False),
        entry(3, 1, retired=False, group="1"),
        entry(4, 0, op="send", retired=False, p2p=True),  # point-to-point: no collective sequence number
    ]
    assert [(e["process_group"][0], e["collective_seq_id"]) for e in flight_entries.in_flight(entries)] == [
        ("0", 3),
        ("1", 1),
    ]


def test_sequence_numbers_count_from_zero_as_the_python_recorder_counts():
    assert flight.last_seq_by_group([entry(0, 1), entry(1, 2), entry(2, 5, group="3")]) == {"0": 1, "3": 4}
    assert flight_entries.thread_of({"thread_id": "140000"}) == 140000
    assert flight_entries.thread_of({"thread_id": "x"}) is None and flight_entries.thread_of({}) is None


def test_one_reading_of_an_entry_serves_the_live_feed_the_dump_reader_and_the_unseen_collective():
    """Issue 44: three translators of a Flight Recorder entry disagreed (the evidence of an unseen collective wrote
    dtype "Float" where the others wrote "float32"); the three now read an entry's group, tensors and op alike."""
    from ddpwatch.sources import flight_recorder as offline
    from ddpwatch.watch import evidence

    fr = {
        "process_group": ["3", "tp"],
        "collective_seq_id": 7,
        "profiling_name": "gloo:allreduce",
        "input_sizes": [[2, 3], [4]],
        "input_dtypes": ["Float", "BFloat16"],
        "time_created_ns": 1_000_000_000,
        "frames": [],
    }
    assert flight_entries.shapes_and_dtypes(fr, build.TENSORS_KEPT) == ([[2, 3], [4]], ["float32", "bfloat16"])
    assert flight_entries.group_of(fr) == "3" and flight_entries.group_of({"pg_id": "5"}) == "5"
    unseen = evidence.record_from_flight_recorder(fr, {"last_seq": {"3": 1}}, sys._getframe(), 2.0)
    dumped = offline._record(fr, 0, 2.0)
    for record in (unseen, dumped):
        assert (record["group"], record["op"], record["shapes"], record["dtypes"]) == (
            "3",
            "all_reduce",
            [[2, 3], [4]],
            ["float32", "bfloat16"],
        ), record


@pytest.fixture
def feed(monkeypatch):
    recorder = Recorder(64)
    recorder.note_recorded_by(FLIGHT)
    named = []
    made = flight.FlightFeed(recorder, named.append)
    made.entries = []
    made.status = {}  # the Flight Recorder's pg_status: nothing enqueued and not completed
    monkeypatch.setattr(flight, "read_flight_recorder", lambda stack_traces=False: list(made.entries))
    monkeypatch.setattr(made, "_read_status", lambda: made.status)
    return made


def test_a_look_puts_the_waiting_threads_op_in_flight_at_its_own_line(feed):
    feed.entries = [entry(0, 1), entry(1, 2, op="broadcast"), entry(2, 3, retired=False, sizes=((2, 3), (5,)))]
    here = sys._getframe()
    looked_at = here.f_lineno + 1  # where this thread stands while it is looked at: the next line
    feed.look({threading.get_ident(): here})
    snapshot = feed.recorder.snapshot(recent=8)
    [waiting] = snapshot["inflight"]
    assert (waiting["seq"], waiting["op"], waiting["api"], waiting["group"]) == (2, "all_reduce", "all_reduce", "0")
    assert waiting["site"]["line"] == looked_at and waiting["site"]["file"] == __file__
    assert waiting["shapes"] == [[2, 3], [5]] and waiting["dtypes"] == ["float32", "float32"]
    assert [(r["seq"], r["op"], r["state"]) for r in snapshot["recent"]] == [
        (0, "all_reduce", build.COMPLETED),
        (1, "broadcast", build.COMPLETED),
    ]
    assert snapshot["last_seq"] == {"0": 2} and snapshot["recorder"] == FLIGHT


def test_an_op_of_a_thread_that_is_not_waiting_has_no_line(feed):
    feed.entries = [entry(0, 1, retired=False, thread=12345)]
    feed.look({threading.get_ident(): sys._getframe()})
    [record] = feed.recorder.snapshot()["inflight"]
    assert record["site"] is None and record["api"] == "all_reduce"


def test_an_op_in_flight_whose_thread_waits_nowhere_inside_torch_is_one_the_rank_does_not_wait_in(feed):
    """A look made for a pending op (no thread waits inside torch: an async op overlapped with computation, a thread
    polling is_completed()) hands it over as returned, not waited: no crossing may count the rank as waiting in it.
    Asked again at each look: once its thread waits inside torch, the rank waits in it."""
    feed.entries = [entry(0, 1, retired=False)]
    feed.look({})
    [held] = feed.recorder.snapshot()["inflight"]
    assert (held["async"], held["waited"]) == (True, False) and not analysis.waits_in(held)
    feed.look({threading.get_ident(): sys._getframe()})
    [inside] = feed.recorder.snapshot()["inflight"]
    assert "async" not in inside and analysis.waits_in(inside)


def test_progress_ends_what_a_look_found_and_a_later_look_keeps_the_same_record(feed, monkeypatch):
    feed.entries = [entry(0, 1, retired=False)]
    feed.look({})
    assert len(feed.recorder.inflight) == 1 and len(feed.recorder.ring) == 1
    monkeypatch.setattr(feed, "_count_new_ops", lambda: 1)
    progress = feed.recorder.progress
    feed.poll(now=100.0)
    assert feed.recorder.progress == progress + 1
    assert not feed.recorder.inflight, "a record left in flight after progress would read as a blocked rank"
    assert [r.state for r in feed.recorder.ring] == [build.COMPLETED]
    feed.look({})  # still unretired (an async op the rank waits on later): in flight again, not a second record
    assert len(feed.recorder.inflight) == 1 and len(feed.recorder.ring) == 1
    assert next(iter(feed.recorder.inflight)).state == build.IN_FLIGHT


def test_the_feed_looks_once_per_quiet_spell_and_only_while_a_thread_waits_inside_torch(feed, monkeypatch):
    looks, waiting = [], {}
    monkeypatch.setattr(feed, "look", looks.append)
    monkeypatch.setattr(flight, "waiting_threads", lambda skip: dict(waiting))
    monkeypatch.setattr(feed, "_count_new_ops", lambda: 0)
    start = feed._quiet_since
    feed.poll(now=start + flight.LOOK_AFTER_S / 2)
    assert looks == []  # quiet, but not for long enough
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.01)
    assert looks == []  # no thread waits inside torch: a rank computing is not looked at
    waiting[1] = sys._getframe()
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.5)
    assert looks == [{1: waiting[1]}]
    feed.poll(now=start + flight.LOOK_AFTER_S + 5.0)
    assert len(looks) == 1  # one dump per quiet spell: it holds the GIL
    assert feed.due_in(start + flight.LOOK_AFTER_S + 5.0) == pytest.approx(flight.POLL_S)


def test_a_failed_wait_with_no_record_still_reaches_the_watchdog_in_flight_mode():
    errors = []
    recorder = Recorder(8)
    recorder.set_failure_hook(errors.append)
    lost = RuntimeError("Connection closed by peer")
    recorder.waited(object(), None, lost)
    assert errors == []  # the python recorder: a wait it has no record of is not its business
    recorder.note_recorded_by(FLIGHT)
    recorder.waited(object(), None, lost)
    assert errors == [lost]


def test_the_flight_recorder_is_unavailable_when_its_buffer_is_off(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    assert flight_support.unavailable() is None
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert "TORCH_FR_BUFFER_SIZE=0" in flight_support.unavailable()


def test_a_group_whose_backend_cannot_be_read_is_not_served():
    assert "backend cannot be read" in flight_support.backend_unsupported(object())


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_an_nccl_group_is_not_served_its_collectives_go_to_a_recorder_of_their_own(monkeypatch, backend):
    """ProcessGroupNCCL records into FlightRecorderCUDA (read by _dump_nccl_trace), not the generic recorder that
    _dump_fr_trace reads: read there, an NCCL job would progress and never be found in a collective."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_backend", lambda pg=None: backend)
    assert "NCCL's collectives go to its own Flight Recorder" in flight_support.backend_unsupported(None)
    monkeypatch.setattr(dist, "get_backend", lambda pg=None: "gloo")
    assert flight_support.backend_unsupported(None) is None


def test_the_flight_patcher_wraps_no_collective_until_asked_to():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ddpwatch.capture.wrappers import Patcher

    patcher = Patcher(Recorder(8))
    try:
        patcher.patch(per_op=False)
        assert not patcher.per_op
        assert not hasattr(dist.all_reduce, PATCH_MARKER) and not hasattr(dist.barrier, PATCH_MARKER)
        assert hasattr(DistributedDataParallel.forward, PATCH_MARKER)  # the steps and the region: per forward
        assert hasattr(dist.isend, PATCH_MARKER)  # gloo's Flight Recorder has no point-to-point entries
        patcher.add_per_op()
        assert patcher.per_op and hasattr(dist.all_reduce, PATCH_MARKER)
    finally:
        patcher.unpatch()
    assert not hasattr(dist.all_reduce, PATCH_MARKER) and not hasattr(DistributedDataParallel.forward, PATCH_MARKER)


USER = {"filename": "/home/me/train.py", "line": 42, "name": "train"}
C10D = {"filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 9,
        "name": "all_reduce"}  # fmt: skip


def traced(*entries):
    """Entries as a dump with stack traces has them: each with its frames, innermost first."""
    return [dict(e, frames=[C10D, USER]) for e in entries]


def test_a_read_gives_the_finished_collectives_their_lines_and_counts_from_the_dumped_frames(feed):
    feed.entries = traced(entry(0, 1), entry(1, 2))
    feed.look({})
    snapshot = feed.recorder.snapshot(recent=8)
    assert [(r["seq"], r["site"]["line"], r["api"]) for r in snapshot["recent"]] == [
        (0, 42, "all_reduce"),
        (1, 42, "all_reduce"),
    ]
    assert snapshot["site_counts"] == {"/home/me/train.py:42": 2}


def test_the_ops_of_one_library_call_are_one_record_in_flight_and_in_the_ring(feed, monkeypatch):
    created = entry(0, 1)["time_created_ns"]  # entry k is created k ns after entry 0
    ident = threading.get_ident()
    windows = [(ident, created + 1, created + 2), (ident, created + 4, None)]  # a buffer sync done, one running
    monkeypatch.setattr(feed.recorder, "call_windows", lambda: list(windows))
    feed.entries = [
        entry(0, 1, op="all_reduce"),
        entry(1, 2, op="broadcast"),
        entry(2, 3, op="broadcast", sizes=((1,),)),
        entry(3, 4, op="all_reduce"),
        entry(4, 5, op="broadcast", retired=False),
        entry(5, 6, op="broadcast", retired=False, sizes=((1,),)),
    ]
    feed.look({})
    snapshot = feed.recorder.snapshot(recent=8)
    [waiting] = snapshot["inflight"]
    assert (waiting["seq"], waiting["op"], waiting["shapes"]) == (4, "broadcast", [[4], [1]])
    assert [(r["seq"], r["op"], r["shapes"]) for r in snapshot["recent"]] == [
        (0, "all_reduce", [[4]]),
        (1, "broadcast", [[4], [1]]),
        (3, "all_reduce", [[4]]),
    ]
    assert snapshot["last_seq"] == {"0": 4}  # the last record's, as the python recorder counts its records
    feed.look({})  # nothing new: no record given twice, the running call still the one in flight
    assert len(feed.recorder.ring) == 4 and len(feed.recorder.inflight) == 1


def test_a_call_window_is_the_outermost_calls_and_open_while_it_runs():
    recorder = Recorder(8)
    with recorder.call_window():
        with recorder.call_window():  # _sync_module_states calls _broadcast_coalesced: one call
            [(thread, start, end)] = recorder.call_windows()
        assert (thread, end) == (threading.get_ident(), None)
    [(thread, start_again, end)] = recorder.call_windows()
    assert start_again == start and end >= start


def test_the_flight_patcher_marks_the_calls_that_issue_several_ops_until_the_per_op_wrappers_come():
    import torch.autograd
    import torch.distributed as dist

    from ddpwatch.capture.wrappers import Patcher

    untouched = (dist._broadcast_coalesced, torch.autograd.backward, dist.Reducer._rebuild_buckets)
    patcher = Patcher(Recorder(8))
    try:
        patcher.patch(per_op=False)
        windows = (dist._broadcast_coalesced, torch.autograd.backward, dist.Reducer._rebuild_buckets)
        assert [getattr(f, PATCH_MARKER, None) for f in windows] == list(untouched)
        assert hasattr(dist._verify_params_across_processes, PATCH_MARKER)
        patcher.add_per_op()  # the python recorder's own wrappers, on the originals
        per_op = (dist._broadcast_coalesced, torch.autograd.backward, dist.Reducer._rebuild_buckets)
        assert not set(per_op) & set(windows)
        assert [getattr(f, PATCH_MARKER, None) for f in per_op] == list(untouched)
    finally:
        patcher.unpatch()
    assert (dist._broadcast_coalesced, torch.autograd.backward, dist.Reducer._rebuild_buckets) == untouched


def test_a_synced_backward_is_one_call_and_any_other_backward_is_none():
    from ddpwatch.capture.call_windows import grad_sync_window_wrapper

    recorder = Recorder(8)
    inside = []
    backward = grad_sync_window_wrapper(recorder, lambda: inside.append(recorder.call_windows()))
    backward()
    recorder.note_ddp_forward("pg")
    backward()
    assert inside[0] == [] and [end for _, _, end in inside[1]] == [None]
    assert len(recorder.call_windows()) == 1


def test_a_refresh_reads_only_after_progress_and_spaces_its_reads_by_their_own_cost(feed, monkeypatch):
    reads, clock = [], iter([0.0, 0.004])  # perf_counter around the one read: it takes 4 ms
    monkeypatch.setattr(flight, "read_flight_recorder", lambda stack_traces=False: reads.append(stack_traces) or [])
    monkeypatch.setattr(flight.time, "perf_counter", lambda: next(clock))
    feed.refresh(now=10.0)
    assert reads == []  # nothing was issued since the last read: nothing to read
    feed._unread = 3
    feed.refresh(now=10.0)
    assert reads == [True]  # with stack traces: the lines are what the fingerprints compare
    feed._unread = 3
    feed.refresh(now=10.0 + 0.004 / flight.READ_SHARE - 0.01)
    assert reads == [True], "no sooner than the last read's cost allows"
    monkeypatch.setattr(flight.time, "perf_counter", lambda: 0.0)
    feed.refresh(now=10.0 + 0.004 / flight.READ_SHARE)
    assert reads == [True, True]


def test_a_refresh_hands_over_what_finished_and_leaves_what_is_in_flight_for_a_later_read(feed):
    feed._unread = 1
    feed.entries = traced(entry(0, 1), entry(1, 2, retired=False), entry(2, 1, group="1"))
    feed.refresh(now=0.0)
    assert [(r.group, r.seq) for r in feed.recorder.ring] == [("0", 0)]
    assert not feed.recorder.inflight  # the rank moves on: an op in flight now is a moment's state
    feed.entries = traced(entry(0, 1), entry(1, 2), entry(2, 1, group="1"))
    feed._unread, feed._next_read = 1, 0.0
    feed.refresh(now=100.0)
    assert [(r.group, r.seq, r.site[1]) for r in feed.recorder.ring] == [("0", 0, 42), ("0", 1, 42), ("1", 0, 42)]


def test_a_read_for_an_incident_keeps_what_a_look_found_in_flight(feed):
    """The abort policy checks the verdict's position against this rank's own: a read for the incident's answer
    (no look) must not end the record the rank waits in."""
    feed.entries = traced(entry(0, 1), entry(1, 2, retired=False))
    feed.look({threading.get_ident(): sys._getframe()})
    [waiting] = feed.recorder.inflight
    feed.refresh(now_or_never=True)
    assert list(feed.recorder.inflight) == [waiting] and waiting.state == build.IN_FLIGHT
    assert len(feed.recorder.ring) == 2


def test_the_symbolizer_is_loaded_on_the_arming_thread_so_that_no_read_imports_anything(monkeypatch):
    """A read with stack traces imports torch._inductor.codecache the first time: never from the watchdog thread."""
    assert flight_support.load_symbolizer() is None and sys.modules.get("torch._inductor.codecache") is not None
    monkeypatch.setitem(sys.modules, "torch._inductor.codecache", None)  # an import that fails: said, not raised
    assert "cannot be loaded" in flight_support.load_symbolizer()


def test_records_a_look_hands_over_without_progress_are_filed_for_the_mismatch_check(feed):
    from ddpwatch.watch.fingerprints import FingerprintLog

    log = FingerprintLog(feed.recorder)
    feed.entries = traced(entry(0, 1))
    feed.look({})
    log.collect()
    feed.entries = traced(entry(0, 1), entry(1, 2, sizes=((8,),)))
    feed.look({})  # no progress counted in between: the ring alone says what is new
    log.collect()
    document = log.document()
    assert document["groups"]["0"]["first"] == 0 and len(document["groups"]["0"]["ids"]) == 2
    counts = sorted(sig["counts"] for sig in document["signatures"].values())
    assert counts == [[4], [8]]


def test_a_collective_that_raises_is_a_failed_record_that_reaches_the_failure_hook(monkeypatch):
    """No wrapper sees a synchronous collective fail under flight: torch's own failure log (c10d_logger) does."""
    import torch
    from torch.distributed import c10d_logger

    from ddpwatch.capture.failures import FailureListener

    recorder, errors = Recorder(8), []
    recorder.set_failure_hook(errors.append)
    groups = type("Groups", (), {"recorder": recorder, "group_name": lambda self, group: "0"})()
    monkeypatch.setattr(c10d_logger, "_c10d_logger", FailureListener(c10d_logger._c10d_logger, groups))

    @c10d_logger._exception_logger
    def all_reduce(tensor, op=None, group=None, async_op=False):
        raise RuntimeError("Connection closed by peer")

    @c10d_logger._exception_logger
    def all_gather_object(object_list, obj, group=None):  # an object collective: its inner op failed first
        all_reduce(torch.ones(2))

    here = sys._getframe().f_lineno
    with pytest.raises(RuntimeError, match="closed by peer"):
        all_reduce(torch.ones(8, dtype=torch.int32))
    with pytest.raises(RuntimeError):
        all_gather_object([None], 1)
    first, second = recorder.snapshot(recent=8)["recent"]
    assert (first["state"], first["op"], first["group"]) == (build.FAILED, "all_reduce", "0")
    assert first["shapes"] == [[8]] and first["dtypes"] == ["int32"] and "closed by peer" in first["error"]
    assert first["site"]["line"] == here + 2 and first["site"]["file"] == __file__
    assert second["shapes"] == [[2]], "one failed record per error: the object collective re-raised its inner op's"
    assert [str(error) for error in errors] == ["Connection closed by peer"] * 2


def test_the_failure_listener_and_the_reduce_op_notes_are_put_in_once_and_taken_out_with_the_patches():
    import torch.distributed as dist
    from torch.distributed import c10d_logger

    from ddpwatch.capture import failures, reduce_ops
    from ddpwatch.capture.failures import FailureListener
    from ddpwatch.capture.wrappers import Patcher

    original = c10d_logger._c10d_logger
    patcher = Patcher(Recorder(8))
    try:
        patcher.patch(per_op=False)
        all_reduce = dist.all_reduce
        for _ in range(2):  # idempotent: not a listener around a listener, nor a wrapper around a wrapper
            failures.install(patcher)
            reduce_ops.install(patcher.patches, reduce_ops.ReduceNotes())
        assert isinstance(c10d_logger._c10d_logger, FailureListener)
        assert c10d_logger._c10d_logger._logger is original
        assert getattr(dist.all_reduce, PATCH_MARKER) is all_reduce and not hasattr(dist.broadcast, PATCH_MARKER)
    finally:
        patcher.unpatch()
    assert c10d_logger._c10d_logger is original and dist.all_reduce is all_reduce


def test_a_reduce_op_but_sum_is_noted_by_thread_and_time_and_sum_costs_only_the_call():
    from torch.distributed import ReduceOp

    from ddpwatch.capture.reduce_ops import ReduceNotes, reduce_op_wrapper

    calls, notes = [], ReduceNotes()

    def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
        calls.append(op)

    wrapped = reduce_op_wrapper(all_reduce, notes)
    wrapped("t")
    wrapped("t", ReduceOp.SUM)
    assert calls == [ReduceOp.SUM] * 2 and notes.op_of(threading.get_ident(), 0) is None
    wrapped("t", op=ReduceOp.MAX)
    [(ident, started, ended, op)] = list(notes._notes)
    assert (ident, op) == (threading.get_ident(), ReduceOp.MAX) and started <= ended
    assert notes.op_of(ident, started) is ReduceOp.MAX and notes.op_of(ident, ended + 1) is None
    assert notes.op_of(ident + 1, started) is None  # another thread's entry at that moment is not this call's


def test_a_call_still_running_has_its_reduce_op_noted_already():
    """A look made while the rank waits inside all_reduce(op=MIN) (its entry in flight) finds MIN: noted only on
    return, it read as SUM and the record kept it (a false silent_mismatch seen under the flight suite's load)."""
    import time

    from torch.distributed import ReduceOp

    from ddpwatch.capture.reduce_ops import ReduceNotes, reduce_op_wrapper

    notes, seen = ReduceNotes(), []

    def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
        seen.append(notes.op_of(threading.get_ident(), time.time_ns()))  # torch creates its entry in here

    reduce_op_wrapper(all_reduce, notes)("t", op=ReduceOp.MIN)
    assert seen == [ReduceOp.MIN]


def test_a_reducing_entry_takes_its_noted_op_and_is_a_sum_without_one(monkeypatch):
    from torch.distributed import ReduceOp

    from ddpwatch.capture.reduce_ops import ReduceNotes

    notes = ReduceNotes()
    made = flight.FlightFeed(Recorder(64), lambda pg: None, notes)
    made.entries = [entry(0, 1), entry(1, 2), entry(2, 3, op="broadcast")]
    monkeypatch.setattr(flight, "read_flight_recorder", lambda stack_traces=False: list(made.entries))
    created = made.entries[1]["time_created_ns"]
    notes.add(threading.get_ident(), created, created, ReduceOp.MAX)  # the fixture's entries are 1 ns apart
    made.look({})
    assert [getattr(r, "reduce", None) for r in made.recorder.ring] == ["sum", ReduceOp.MAX, None]


def test_a_dump_with_stack_traces_that_fails_still_gives_the_entries_without_their_frames(monkeypatch):
    """torch cannot cast a frame whose file name is not UTF-8 (a script under b"caf\\xe9"): the whole dump fails."""
    import pickle

    import torch._C._distributed_c10d as c10d_c

    def dump(collectives, stack_traces, only_active):
        if stack_traces:
            raise RuntimeError("Unable to cast Python instance of type <class 'str'> to C++ type '?'")
        return pickle.dumps({"entries": [entry(0, 1)]})

    monkeypatch.setattr(c10d_c, "_dump_fr_trace", dump)
    assert [e["collective_seq_id"] for e in flight.read_flight_recorder(stack_traces=True)] == [1]


def test_the_one_reader_merges_nccls_own_recorder_with_the_generic_one_and_survives_either_failing(monkeypatch):
    """Issue 44 point 3: NCCL records into a recorder of its own (_dump_nccl_trace, CUDA builds). The evidence reads
    both through flight_support.read_dump; the feed (gloo only) asks for the generic one alone. A reader that raises
    or is absent leaves the other's entries."""
    import pickle

    import torch._C._distributed_c10d as c10d_c

    from ddpwatch.watch import flight_support

    generic = {"entries": [entry(0, 1)], "pg_status": {"0": {"last_completed_collective": 1}}}
    nccl_entry = dict(entry(1, 1, group="1"), profiling_name="nccl:all_reduce", input_dtypes=["BFloat16"])
    nccl = {"entries": [nccl_entry], "pg_status": {"1": {"last_completed_collective": 0}}}
    asked = []

    def reader(dump):
        def read(collectives, stack_traces, only_active):
            asked.append((collectives, stack_traces, only_active))
            if isinstance(dump, Exception):
                raise dump
            return pickle.dumps(dump)

        return read

    monkeypatch.setattr(c10d_c, "_dump_fr_trace", reader(generic))
    monkeypatch.setattr(c10d_c, "_dump_nccl_trace", reader(nccl), raising=False)
    both = flight_support.read_dump(only_active=True)
    assert [flight_entries.group_of(e) for e in both["entries"]] == ["0", "1"]
    assert set(both["pg_status"]) == {"0", "1"} and asked == [(True, False, True)] * 2
    assert flight_entries.shapes_and_dtypes(both["entries"][1], 4)[1] == ["bfloat16"]
    assert [flight_entries.group_of(e) for e in flight_support.read_dump(nccl=False)["entries"]] == ["0"]
    monkeypatch.setattr(c10d_c, "_dump_nccl_trace", reader(RuntimeError("no NCCL group")))
    assert [flight_entries.group_of(e) for e in flight_support.read_dump()["entries"]] == ["0"]
    monkeypatch.setattr(c10d_c, "_dump_fr_trace", reader(RuntimeError("off")))
    assert flight_support.read_dump() is None


def test_a_wait_that_ends_without_a_new_op_ends_what_the_look_found(feed, monkeypatch):
    """A barrier done, the rank computes (no op issued, no sequence number moved): not blocked in that barrier."""
    waiting = {threading.get_ident(): sys._getframe()}
    monkeypatch.setattr(flight, "waiting_threads", lambda skip: dict(waiting))
    monkeypatch.setattr(feed, "_count_new_ops", lambda: 0)
    feed.entries = [entry(0, 1, retired=False)]
    start = feed._quiet_since
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.01)
    [record] = feed.recorder.inflight
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.2)
    assert list(feed.recorder.inflight) == [record], "still waiting: still in flight"
    waiting.clear()
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.4)
    assert not feed.recorder.inflight and record.state == build.COMPLETED
    waiting[threading.get_ident()] = sys._getframe()  # waits again, on what is still unretired: the same record
    feed.poll(now=start + 2 * flight.LOOK_AFTER_S + 0.5)
    assert list(feed.recorder.inflight) == [record] and record.state == build.IN_FLIGHT


def status(enqueued, completed, group="0"):
    """A group's entry in the Flight Recorder's pg_status, as torch 2.13 writes it (gloo: nothing is "started")."""
    return {
        group: {
            "last_enqueued_collective": enqueued,
            "last_started_collective": -1,
            "last_completed_collective": completed,
        }
    }


def test_a_collective_is_pending_while_a_group_has_one_enqueued_and_not_completed():
    assert flight.collectives_pending(status(3, 2))
    assert flight.collectives_pending({**status(4, 4), **status(1, -1, group="1")})
    assert not flight.collectives_pending(status(4, 4))
    assert not flight.collectives_pending({}) and not flight.collectives_pending(None)
    assert not flight.collectives_pending({"0": {"last_enqueued_collective": 2}})  # a field missing: not known


def test_a_rank_whose_thread_waits_outside_torch_on_a_pending_collective_is_looked_at_until_it_completes(
    feed, monkeypatch
):
    """An async all_reduce whose thread polls is_completed() in a sleep loop (NCCL's way: blocked at a device sync,
    outside torch): no thread waits inside torch, yet the rank is in that collective, at the line that issued it."""
    monkeypatch.setattr(flight, "waiting_threads", lambda skip: {})
    monkeypatch.setattr(feed, "_count_new_ops", lambda: 0)
    feed.entries = traced(entry(0, 1), entry(1, 2, retired=False))
    start = feed._quiet_since
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.01)
    assert not feed.recorder.inflight, "nothing pending: a rank computing is not looked at"
    feed.status = status(2, 1)
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.2)
    [record] = feed.recorder.inflight
    assert (record.seq, record.op, record.site[1]) == (1, "all_reduce", 42)  # the issuing line, from its frames
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.4)
    assert list(feed.recorder.inflight) == [record], "still pending: still in flight"
    feed.status = status(2, 2)
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.6)
    assert not feed.recorder.inflight and record.state == build.COMPLETED


def test_a_look_for_a_waiting_thread_ends_when_it_stops_waiting_though_another_collective_is_pending(feed, monkeypatch):
    """Through a barrier, an async all_reduce still pending on another group: the barrier is not left in flight
    (the rank would read as blocked in it); the next look, made for the pending op, finds that one alone."""
    waiting = {threading.get_ident(): sys._getframe()}
    monkeypatch.setattr(flight, "waiting_threads", lambda skip: dict(waiting))
    monkeypatch.setattr(feed, "_count_new_ops", lambda: 0)
    feed.entries = traced(entry(0, 1, retired=False, group="1"), entry(1, 1, op="barrier", retired=False))
    feed.status = {**status(1, 0, group="1"), **status(1, 0)}
    start = feed._quiet_since
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.01)
    assert sorted(record.op for record in feed.recorder.inflight) == ["all_reduce", "barrier"]
    waiting.clear()
    feed.entries = traced(entry(0, 1, retired=False, group="1"), entry(1, 1, op="barrier"))
    feed.status = {**status(1, 0, group="1"), **status(1, 1)}
    feed.poll(now=start + flight.LOOK_AFTER_S + 0.2)
    assert not feed.recorder.inflight, "the barrier is done: not in flight"
    feed.poll(now=start + 2 * flight.LOOK_AFTER_S + 0.4)
    assert [(record.op, record.group) for record in feed.recorder.inflight] == [("all_reduce", "1")]


# ---------------------------------------------------------------- a fast job: the ranks sample the same positions


def buffer_at(newest: int, kept: int = 2000, group: str = "0") -> list:
    """The Flight Recorder's buffer once `newest` collectives ran: the last `kept` of them, all finished."""
    return traced(*(entry(seq, seq, group=group) for seq in range(max(1, newest - kept + 1), newest + 1)))


def running_feed(stride: int, newest_handed: int = 0):
    feed = flight.FlightFeed(Recorder(4096), lambda pg: None)
    feed._stride, feed._progressed = stride, True
    feed._newest_id = newest_handed
    return feed


def test_ranks_that_read_at_different_moments_of_a_fast_job_hand_over_the_same_block_of_positions(monkeypatch):
    """Thousands of collectives between two reads, more than the buffer keeps: each rank hands over the block that
    ends at the newest multiple of the stride, so its peers' samples are the same positions (the fingerprints are
    compared position by position). Strides of two ranks divide each other: the larger one's block is common."""
    handed = {}
    for rank, (newest, stride) in {0: (8192 + 37, 8192), 1: (8192 + 1500, 4096)}.items():
        feed = running_feed(stride, newest_handed=3000)
        monkeypatch.setattr(flight, "read_flight_recorder", lambda stack_traces=False, n=newest: buffer_at(n))
        feed._unread, feed._block_due = 5000, True
        feed.refresh(now=1.0)
        handed[rank] = [r.seq for r in feed.recorder.ring]
    assert handed[0] == handed[1] == list(range(8192 - flight.HISTORY_KEPT, 8192))  # seqs count from 0


def test_a_group_with_few_new_collectives_is_handed_over_whole_and_a_rank_at_rest_hands_its_newest():
    few = running_feed(1024)
    few._take(buffer_at(40, group="1") + buffer_at(5000, group="0")[-3000:], None)
    groups = [(r.group, r.seq) for r in few.recorder.ring]
    assert [seq for group, seq in groups if group == "1"] == list(range(40))  # a slow group: every position
    assert [seq for group, seq in groups if group == "0"] == list(range(4096 - 64, 4096))  # the block
    resting = running_feed(1024)
    resting._progressed = False  # its peers at rest end at the same position: the newest ones are shared
    resting._take(buffer_at(5000), None)
    assert [r.seq for r in resting.recorder.ring] == list(range(5000 - 64, 5000))


def test_a_group_passing_a_multiple_of_the_stride_makes_the_next_refresh_read_at_once():
    feed = running_feed(1024)
    feed._note_blocks({"0": 2999})  # 3,000 collectives read: the last multiple reached is 2,048
    feed._seqs = {1: ("0", 3050)}
    assert not feed._passed_a_block()
    feed._seqs = {1: ("0", 3072)}
    assert feed._passed_a_block()
    # Point-to-point ops count in the group's sequence number, not in its collectives': an estimate without them
    feed._seqs = {1: ("0", 3500)}
    feed._note_blocks({"0": 2999})  # 500 of the 3,500 were sends and receives
    feed._seqs = {1: ("0", 3500 + 71)}
    assert not feed._passed_a_block()
    feed._seqs = {1: ("0", 3500 + 72)}
    assert feed._passed_a_block()


def test_reads_of_a_running_rank_wait_for_a_block_while_a_rank_at_rest_or_a_slow_one_reads_when_its_cost_allows():
    feed = running_feed(1024)
    feed._unread = 500  # more than a read hands over, no multiple passed: a read now would be a sample of its own
    assert not feed._read_due(now=100.0)
    feed._block_due = True
    assert feed._read_due(now=100.0)
    feed._block_due, feed._unread = False, flight.HISTORY_KEPT
    assert feed._read_due(now=100.0)  # all of it fits: nothing to sample, every rank keeps every position
    feed._unread, feed._progressed = 500, False
    assert feed._read_due(now=100.0)


@pytest.mark.parametrize(
    "rate, cost, expected", [(10, 0.001, flight.MIN_STRIDE), (2500, 0.03, 16384), (2600, 0.03, 16384)]
)
def test_the_stride_is_a_power_of_two_that_keeps_reads_to_their_share_of_the_time(rate, cost, expected):
    feed = running_feed(flight.MIN_STRIDE)
    feed._last_read, feed._counted_total = (0.0, 0), rate * 10
    feed._size_stride(10.0, cost)
    assert feed._stride == expected and (rate * cost / flight.READ_SHARE <= feed._stride or rate < 100)


def test_a_read_makes_and_drops_its_objects_with_the_cyclic_collector_off(monkeypatch):
    """A read's tens of thousands of objects brought on full collections (116 ms with the GIL held, measured):
    none runs during one, and the program's own setting stands after it, also when the read fails."""
    import gc

    collections = []
    monkeypatch.setattr(gc, "callbacks", gc.callbacks + [lambda phase, info: collections.append(phase)])

    def heavy_read(stack_traces=False):
        garbage = [{"frames": [{"line": i}]} for i in range(100_000)]  # far past the young generation's threshold
        assert not gc.isenabled() and garbage
        return buffer_at(10)

    monkeypatch.setattr(flight, "read_flight_recorder", heavy_read)
    feed = running_feed(1024)
    feed._unread = 1
    assert gc.isenabled()
    feed.refresh(now=1.0)
    assert gc.isenabled() and collections == [] and len(feed.recorder.ring) == 10
    gc.disable()
    try:
        feed._unread, feed._next_read = 1, 0.0
        feed.refresh(now=1e6)
        assert not gc.isenabled()  # the program turned it off: left off
    finally:
        gc.enable()
    monkeypatch.setattr(flight, "read_flight_recorder", lambda stack_traces=False: 1 / 0)
    feed._unread, feed._next_read = 1, 0.0
    with pytest.raises(ZeroDivisionError):
        feed.refresh(now=2e6)
    assert gc.isenabled()


def test_a_poll_that_sees_a_multiple_of_the_stride_passed_reads_at_once_not_at_the_next_round(monkeypatch):
    """The block ends at the multiple just passed; at 2,500 collectives a second a round later (1 s) is past the
    Flight Recorder's 2,000 entries, and the block is gone."""
    feed = running_feed(1024)
    monkeypatch.setattr(flight, "read_flight_recorder", lambda stack_traces=False: buffer_at(1024 + 40))
    monkeypatch.setattr(feed, "_count_new_ops", lambda: feed.__dict__.update(_block_due=True) or 100)
    feed.poll(now=5.0)
    assert [r.seq for r in feed.recorder.ring] == list(range(1024 - 64, 1024))
    assert not feed._block_due


def simulated_job(monkeypatch, rate: float, stride: int, seconds: float, late_s: float = 0.002):
    """A rank issuing `rate` collectives a second on one group for `seconds`, its watchdog polling when the feed asks
    (each wake-up `late_s` late, never sooner than the watchdog sleeps): the blocks handed over, and the polls made."""
    group, clock = object(), {"now": 0.0}
    feed = flight.FlightFeed(Recorder(4096), lambda pg: "0")
    feed._stride, feed._last_poll, feed._next_poll = stride, 0.0, 0.0
    monkeypatch.setattr(feed, "_size_stride", lambda now, cost: None)  # the stride as given, whatever a read costs
    monkeypatch.setattr(feed, "_read_counts", lambda: [(group, int(rate * clock["now"]))])
    monkeypatch.setattr(flight, "read_flight_recorder", lambda stack_traces=False: buffer_at(int(rate * clock["now"])))
    polls = 0
    while clock["now"] < seconds:
        feed.poll(now=clock["now"])
        polls += 1
        clock["now"] += max(flight.MIN_POLL_S, feed.due_in(clock["now"])) + late_s
    seqs = sorted(r.seq for r in feed.recorder.ring)
    return {seq + 1 for seq in seqs if (seq + 1) % stride == 0 and seq - flight.HISTORY_KEPT + 1 in seqs}, polls


@pytest.mark.parametrize("rate", [12_000, 50_000, 90_000])
def test_a_job_too_fast_for_a_poll_every_poll_s_has_its_blocks_read_before_they_leave_the_buffer(monkeypatch, rate):
    """At 50,000 collectives a second (an NCCL job's speed) 0.1 s is 5,000 collectives, more than the Flight
    Recorder's 2,000: a poll every POLL_S found a multiple passed once its block was gone (2 blocks of 4 were lost
    here), and no rank handed over a sample to compare. Polls come closer near a multiple, only there."""
    blocks, polls = simulated_job(monkeypatch, rate=rate, stride=32_768, seconds=3.0)
    passed = {k * 32_768 for k in range(1, 100) if k * 32_768 / rate < 3.0}
    in_time = {multiple for multiple in passed if multiple / rate < 3.0 - flight.POLL_S}  # the last, maybe not
    assert in_time <= blocks <= passed  # every multiple passed, its 64 positions whole
    assert polls <= 3.0 / flight.POLL_S + 3 * len(passed)  # a few more polls per multiple, at most


def test_a_job_slow_enough_for_the_buffer_keeps_a_poll_every_poll_s(monkeypatch):
    blocks, polls = simulated_job(monkeypatch, rate=2_500, stride=2_048, seconds=3.0)
    assert blocks == {2_048, 4_096, 6_144}
    assert polls == pytest.approx(3.0 / (flight.POLL_S + 0.002), abs=1)


def test_the_buffer_size_is_torchs_setting_or_its_default(monkeypatch):
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    assert flight_support.buffer_size() == flight_support.DEFAULT_BUFFER
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "500")
    assert flight_support.buffer_size() == 500
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "20000")  # the current name wins
    assert flight_support.buffer_size() == 20_000
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "lots")  # not a whole number: ignored here
    assert flight_support.buffer_size() == 500


def test_an_incident_answer_has_the_feed_read_now_before_its_positions_are_filed(feed):
    """The fingerprint log is handed no callback: the state reader refreshes the feed (now or never, whatever the
    last read cost), then files what that read handed over, so an answer carries the positions finished just now."""
    from ddpwatch.watch.rank_state import StateReader

    calls = []
    feed.entries = traced(entry(0, 1))
    real_refresh = feed.refresh
    feed.refresh = lambda now=None, now_or_never=False: calls.append(now_or_never) or real_refresh(now, now_or_never)
    states = StateReader(feed.recorder, Config(), 0, 2, "node0", set(), feed=feed)
    assert states.fingerprints.numbered_by_torch
    answer = states.read(full=True)
    assert calls == [True]
    assert answer["fingerprints"]["groups"]["0"]["ids"], "the entry the read found now is filed in the answer"


def test_without_a_feed_a_state_reader_files_no_positions_and_with_the_python_recorder_numbers_its_own():
    from ddpwatch.watch.flight import NO_FEED
    from ddpwatch.watch.rank_state import StateReader

    assert "fingerprints" not in StateReader(Recorder(), Config(), 0, 2, "node0", set()).read(full=True)
    assert not StateReader(Recorder(), Config(), 0, 2, "node0", set(), feed=NO_FEED).fingerprints.numbered_by_torch
