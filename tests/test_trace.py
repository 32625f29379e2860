"""trace.json: the Chrome trace event format (what Perfetto and chrome://tracing open). No torch."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import barrier, done, incident, rank_state, seed_states, states  # noqa: E402

from ddpwatch import analysis  # noqa: E402
from ddpwatch.render.trace import render_trace  # noqa: E402

US = 1e6
START = 1_700_000_000.0
CREATED = 1_700_000_200.0


def seed_incident(world_size=2):
    st = seed_states(world_size)
    for state in st.values():
        state["recent"] = [done(9, "all_reduce", age=30.0), done(10, "barrier", age=29.0)]
        state["recent"][0]["start"] = START - 2.0
        state["recent"][1]["start"] = START - 1.0
    return incident(st, analysis.assess(st, world_size, 2.0, 300.0).findings)


REQUIRED = {
    "X": {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"},
    "M": {"name", "ph", "pid", "tid", "args"},
    "i": {"name", "ph", "ts", "pid", "tid", "s"},
}


def validate(trace):
    """The trace event format's rules that viewers rely on."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit") in (None, "ms", "ns")
    for event in trace["traceEvents"]:
        assert event["ph"] in REQUIRED, event
        missing = REQUIRED[event["ph"]] - set(event)
        assert not missing, (missing, event)
        assert isinstance(event["name"], str) and event["name"]
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and isinstance(event["dur"], (int, float))
            assert event["dur"] >= 0
            assert isinstance(event["cat"], str) and isinstance(event["args"], dict)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name")
        if event["ph"] == "i":
            assert event["s"] in ("g", "p", "t")
    json.dumps(trace)  # plain JSON all the way down


def complete_events(trace, pid=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid)]


def test_seed_trace_is_valid_and_names_processes_by_rank():
    trace = render_trace(seed_incident(3))
    validate(trace)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    threads = [e for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert {(e["pid"], e["tid"], e["args"]["name"]) for e in threads} == {(r, 0, "MainThread") for r in range(3)}


def test_every_record_is_one_complete_event_in_microseconds():
    trace = render_trace(seed_incident(2))
    events = complete_events(trace, pid=0)
    assert [(e["name"], e["args"]["seq"], e["args"]["state"]) for e in events] == [
        ("all_reduce", 9, "completed"),
        ("barrier", 10, "completed"),
        ("broadcast [_broadcast_coalesced]", 11, "in_flight"),
    ]
    assert events[0]["ts"] == pytest.approx((START - 2.0) * US)
    assert events[0]["dur"] == pytest.approx(0.001 * US)  # duration_s of a completed record
    assert events[2]["args"]["site"].endswith("distributed.py:1400 in _sync_buffers()")
    assert events[2]["args"]["region"].startswith("ddp_forward at /u/val.py:42")


def test_in_flight_ops_extend_to_the_incident_time():
    trace = render_trace(seed_incident(2))
    for rank in (0, 1):
        [waiting] = [e for e in complete_events(trace, rank) if e["args"]["state"] == "in_flight"]
        assert waiting["ts"] + waiting["dur"] == pytest.approx(CREATED * US)
        assert waiting["args"]["mismatch"] == ("culprit" if rank == 0 else "waiting")


def test_the_verdict_is_a_global_instant_at_the_incident():
    trace = render_trace(seed_incident(2))
    [verdict] = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert verdict["ts"] == pytest.approx(CREATED * US) and verdict["s"] == "g"
    assert verdict["name"] == "ddp_forward_on_subset: culprit rank 0"


def test_unknown_durations_and_odd_records_still_make_a_valid_trace():
    record = done(3, "all_reduce")
    record["duration_s"] = None  # Flight Recorder on gloo: completion time unknown
    no_start = done(4, "barrier")
    no_start["start"] = None
    st = states(
        rank_state(0, 2, recent=[record, no_start], inflight=[barrier(thread="worker")]), rank_state(1, 2, inflight=[])
    )
    doc = incident(st, [])
    doc.pop("created_at")  # no incident time: in-flight ops end at start + age
    trace = render_trace(doc)
    validate(trace)
    events = complete_events(trace, 0)
    assert [e["args"].get("duration_unknown") for e in events] == [True, None]
    assert events[1]["tid"] == 1 and events[1]["dur"] == pytest.approx(3.0 * US)
    assert not [e for e in trace["traceEvents"] if e["ph"] == "i"]


def test_a_thousand_ranks_render_quickly():
    trace = render_trace(seed_incident(1024))
    validate(trace)
    assert len({e["pid"] for e in trace["traceEvents"]}) == 1024
