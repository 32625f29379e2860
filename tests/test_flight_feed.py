"""The flight recorder (watch/flight.py) on hand-built Flight Recorder entries: what is in flight, where, and when
the feed looks; the Patcher's per-op switch; the Recorder's side of the feed. No process, no sleep."""

import sys
import threading

import pytest
import torch.distributed  # noqa: F401 - imported at collection: its first import runs ldconfig, a process

from ddpwatch.capture.record import FLIGHT, Recorder
from ddpwatch.capture.replacements import PATCH_MARKER
from ddpwatch.format import build
from ddpwatch.watch import flight


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
    assert [(e["process_group"][0], e["collective_seq_id"]) for e in flight.in_flight_entries(entries)] == [
        ("0", 3),
        ("1", 1),
    ]


def test_sequence_numbers_count_from_zero_as_the_python_recorder_counts():
    assert flight.last_seq_by_group([entry(0, 1), entry(1, 2), entry(2, 5, group="3")]) == {"0": 1, "3": 4}
    assert flight.thread_of({"thread_id": "140000"}) == 140000
    assert flight.thread_of({"thread_id": "x"}) is None and flight.thread_of({}) is None


@pytest.fixture
def feed(monkeypatch):
    recorder = Recorder(64)
    recorder.note_recorded_by(FLIGHT)
    named = []
    made = flight.FlightFeed(recorder, named.append)
    made.entries = []
    monkeypatch.setattr(flight, "read_flight_recorder", lambda: list(made.entries))
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
    assert flight.unavailable() is None
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert "TORCH_FR_BUFFER_SIZE=0" in flight.unavailable()


def test_a_group_whose_backend_cannot_be_read_is_not_served():
    assert "backend cannot be read" in flight.backend_unsupported(object())


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


def test_a_full_read_gives_the_finished_collectives_their_lines_and_counts_once_per_quiet_spell(feed, monkeypatch):
    user = {"filename": "/home/me/train.py", "line": 42, "name": "train"}
    torch_frame = {"filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 9,
                   "name": "all_reduce"}  # fmt: skip
    feed.entries = [entry(0, 1), entry(1, 2)]
    feed.look({})
    traced = [dict(e, frames=[torch_frame, user]) for e in feed.entries]
    dumps = []
    monkeypatch.setattr(flight, "read_flight_recorder", lambda stack_traces=False: dumps.append(stack_traces) or traced)
    feed.fill_lines()
    snapshot = feed.recorder.snapshot(recent=8)
    assert [(r["seq"], r["site"]["line"], r["api"]) for r in snapshot["recent"]] == [
        (0, 42, "all_reduce"),
        (1, 42, "all_reduce"),
    ]
    assert snapshot["site_counts"] == {"/home/me/train.py:42": 2}
    feed.fill_lines()
    assert dumps == [True], "one dump with stack traces per quiet spell: it holds the GIL"


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
