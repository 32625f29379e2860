"""The job protocol over a real in-process c10d store, and the watchdog's abort policy on a failing collective."""

import ast
import json
import sys
import time

import pytest

import ddpwatch.watch.store as store_module
import ddpwatch.watch.watchdog as watchdog_module
from ddpwatch.watch import abort, incident_writer, peers
from ddpwatch.watch.position_text import canonical
from ddpwatch.config import Config
from ddpwatch.capture import record as record_module
from ddpwatch.capture.record import Recorder
from ddpwatch.watch.store import JobProtocol, StateStore

WORLD = 4


def begun_ago(seconds: float, recorder, *args):
    """recorder.begin(*args) as if called `seconds` ago (the record's start and the rank's last progress): a rank
    staged as blocked that long without sleeping."""
    real = record_module._monotonic
    record_module._monotonic = lambda: real() - seconds
    try:
        return recorder.begin(*args)
    finally:
        record_module._monotonic = real


def rec(seq):
    """A record as the store keeps it (what a reader needs of one: validate.REQUIRED["RecordDoc"])."""
    return {"seq": seq, "group": "0", "op": "all_reduce", "state": "in_flight"}


@pytest.fixture
def job():
    import torch.distributed as dist

    return JobProtocol(StateStore(dist.HashStore(), "test"), WORLD)


def test_states_are_by_rank_and_skip_ranks_that_never_published(job):
    job.publish(0, {"rank": 0, "beat": 1})
    job.publish(2, {"rank": 2, "beat": 7})
    assert job.states() == {0: {"rank": 0, "beat": 1}, 2: {"rank": 2, "beat": 7}}
    assert job.states(range(1, 3)) == {2: {"rank": 2, "beat": 7}}
    job.publish(2, {"rank": 2, "beat": 8})  # a heartbeat replaces the last one
    assert job.states([2])[2]["beat"] == 8


def test_counters_waiting_and_leader_beat(job):
    assert job.waiting() == 0 and job.leader_beat() == 0 and job.counters() == (0, 0)
    assert job.change_waiting(1) == 1
    job.change_waiting(1)
    job.change_waiting(-1)
    job.publish(2, {"rank": 2, "beat": 9})  # only the leader's publish is its beat
    assert job.leader_beat() == 0
    job.publish(0, {"rank": 0, "beat": 5})
    job.publish(0, {"rank": 0, "beat": 6}, whole=False)
    assert job.waiting() == 1 and job.leader_beat() == 6


def test_waiting_and_the_incident_number_share_one_counter_without_mixing(job):
    for _ in range(3):
        job.change_waiting(1)
    assert job.open_incident({"trigger": "deadlock"}) == 1
    assert job.open_incident({"trigger": "deadlock"}) == 2
    assert job.change_waiting(-1) == 2
    assert job.counters() == (2, 2) and job.waiting() == 2 and job.latest_incident() == 2


def test_a_counter_driven_below_zero_by_someone_else_reads_as_nothing_waiting(job):
    job.store.add(job.store.key("counters"), -5)  # anyone who reaches the store can do this
    assert job.counters() == (0, 0)


def test_a_round_takes_two_store_round_trips_on_every_rank_the_leader_included(job):
    calls = []
    job.store._store = _Counting(job.store._store, calls)
    dogs = [watchdog_module.Watchdog(Recorder(), Config(grace=0.5), rank, WORLD, None, "") for rank in range(2)]
    for dog in dogs:
        dog.job = job
        dog.tick()  # the first round: nothing recorded, nothing waiting
    calls.clear()
    for dog in dogs:
        dog.tick()
    assert sorted(calls) == ["compare_set", "compare_set", "multi_set", "multi_set"], calls


class _Counting:
    """A store that names each call it passes on."""

    def __init__(self, store, calls, with_args=False):
        self._store, self._calls, self._with_args = store, calls, with_args

    def __getattr__(self, name):
        method = getattr(self._store, name)
        if not callable(method):
            return method

        def call(*args):
            self._calls.append((name, args) if self._with_args else name)
            return method(*args)

        return call


def test_with_history_lays_each_view_over_that_ranks_last_whole_state(job):
    job.publish(1, {"rank": 1, "beat": 3, "recent": [rec(9)], "status": "running"})
    job.publish(1, {"rank": 1, "beat": 5, "status": "running"}, whole=False)  # later positions only
    views = {1: {"rank": 1, "beat": 6, "status": "busy"}, 2: {"rank": 2, "beat": 1}}  # rank 2 never whole
    assert job.with_history(views) == {
        1: {"rank": 1, "beat": 6, "status": "busy", "recent": [rec(9)]},
        2: {"rank": 2, "beat": 1},
    }
    assert job.with_history({}) == {}


def test_one_claim_per_fingerprint(job):
    assert job.claim("abc") is True
    assert job.claim("abc") is False
    assert job.claim("def") is True


def test_an_incident_from_opening_to_acks(job):
    assert job.latest_incident() == 0
    number = job.open_incident({"trigger": "deadlock", "leader": 0, "action": "abort"})
    assert number == 1 and job.latest_incident() == 1
    assert job.incident_info(1)["action"] == "abort"
    assert job.incident_info(2) == {}  # not opened: empty, never waited for
    for rank in range(WORLD):
        job.contribute(1, rank, {"rank": rank, "stacks": []})
    start = time.monotonic()
    answers = job.collect(1, deadline=start + 30.0)
    assert sorted(answers) == list(range(WORLD)) and answers[3] == {"rank": 3, "stacks": []}
    assert time.monotonic() - start < 30.0  # every rank answered: no wait for the deadline
    job.contribute_native(1, 2, {"threads": []})
    assert job.natives(1, {1, 2}) == {2: {"threads": []}}
    assert job.verdict(1) is None
    job.post_verdict(1, {"folder": "/x", "kinds": ["deadlock"]})
    assert job.verdict(1)["folder"] == "/x"
    job.ack(1)
    job.ack(1)
    assert job.acks(1) == 2


@pytest.mark.real
def test_collect_returns_what_came_by_the_deadline(job):
    number = job.open_incident({"trigger": "deadlock"})
    job.contribute(number, 1, {"rank": 1})
    assert job.collect(number, deadline=time.monotonic() + 0.2) == {1: {"rank": 1}}


def test_incidents_of_two_jobs_do_not_mix():
    import torch.distributed as dist

    shared = dist.HashStore()
    one, two = JobProtocol(StateStore(shared, "one"), 2), JobProtocol(StateStore(shared, "two"), 2)
    one.publish(0, {"rank": 0})
    assert one.open_incident({}) == 1 and two.latest_incident() == 0
    assert two.states() == {}


@pytest.mark.parametrize("module", [watchdog_module, peers, incident_writer, abort])
def test_the_watchdog_builds_no_store_keys(module):
    tree = ast.parse(open(module.__file__, encoding="utf-8").read())
    calls = [
        node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]
    assert "key" not in calls and "get_many" not in calls and "put" not in calls


class Ended(BaseException):  # not an Exception: the recorder swallows those from its hook, and os._exit never returns
    pass


def abort_watchdog(monkeypatch, action="report"):
    codes = []

    def fake_end(code):
        codes.append(code)
        raise Ended

    monkeypatch.setattr(abort, "end_process", fake_end)
    recorder = Recorder()
    dog = watchdog_module.Watchdog(recorder, Config(exit_code=7, action=action), 1, 2, None, "")
    recorder.set_failure_hook(dog.failure_hook)  # what start() installs (the thread is never started here)
    return dog, recorder, codes


@pytest.mark.real
def test_a_failing_collective_after_an_abort_verdict_ends_the_rank(monkeypatch):
    dog, recorder, codes = abort_watchdog(monkeypatch)
    failing = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())
    recorder.finish(failing, RuntimeError("Connection closed by peer"))  # no verdict yet: the error goes on
    assert codes == []
    dog.policy.arm()  # the verdict is out
    ok = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())
    recorder.finish(ok)  # success: no exit
    assert codes == []
    failing = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())
    with pytest.raises(Ended):
        recorder.finish(failing, RuntimeError("peer gone"))
    assert codes == [7]
    assert failing.error == "RuntimeError: peer gone"  # the recorder recorded it first; the watchdog decided


def test_the_abort_hook_outlives_stop(monkeypatch):
    dog, recorder, codes = abort_watchdog(monkeypatch)
    dog.stop()  # no store: nothing is published on the way out
    assert recorder.failure_hook is None  # no verdict: stop() takes the hook away
    dog, recorder, codes = abort_watchdog(monkeypatch)
    dog.policy.arm()
    dog.stop()
    with pytest.raises(Ended):
        recorder.failure_hook(RuntimeError("peer gone"))
    assert codes == [7]


def test_publish_writes_the_state_and_its_position_in_one_round_trip(job):
    calls = []
    store = job.store._store

    class Counting:
        def __getattr__(self, name):
            method = getattr(store, name)
            return lambda *args: calls.append(name) or method(*args)

    job.store._store = Counting()
    state = {
        "rank": 1,
        "beat": 3,
        "status": "running",
        "inflight": [rec(4)],
        "recent": [rec(3)],
        "site_counts": {"a.py:1": 2},
        "last_seq": {"0": 3},
        "ops_recorded": 4,
        "rank_condition": None,
    }
    job.publish(1, state)
    assert calls == ["multi_set"]
    job.store._store = store
    assert job.states() == {1: state}
    assert job.positions() == {
        1: {"rank": 1, "beat": 3, "status": "running", "inflight": [rec(4)], "rank_condition": None}
    }


def test_a_torn_or_foreign_value_is_left_out_and_the_others_still_read(job):
    for rank in range(WORLD):
        job.publish(rank, {"rank": rank})
    raw = job.store._store
    raw.set(job.store.key("pos", 1), "{not json")
    raw.set(job.store.key("pos", 2), '"a string, not a state"')
    assert sorted(job.positions()) == [0, 3]
    raw.set(job.store.key("pos", 1), '{"rank": 1}, {"rank": 9}')  # one value that would read as two
    assert sorted(job.positions()) == [0, 3]


def test_a_pending_abort_incident_ends_the_rank_on_a_peer_failure_only(monkeypatch):
    dog, recorder, codes = abort_watchdog(monkeypatch, action="abort")
    dog.policy.consider(1, {"action": "abort", "leader": 0})  # an abort incident is open: the verdict may follow
    failing = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())
    recorder.finish(failing, RuntimeError("shape mismatch"))  # the user's own error goes on
    assert codes == []
    failing = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())
    with pytest.raises(Ended):
        recorder.finish(failing, RuntimeError("Connection closed by peer"))
    assert codes == [7]


def blocked_state(rank):
    return {"rank": rank, "status": "running", "idle_s": 1.0, "inflight": [{"group": "0", "seq": 3, "age_s": 1.0}]}


def test_the_rank_whose_registration_completes_the_count_is_the_last_to_block_and_looks_at_once(job):
    dogs = [watchdog_module.Watchdog(Recorder(), Config(grace=0.5), rank, WORLD, None, "") for rank in range(WORLD)]
    for dog in dogs:
        dog.job = job
    for dog in dogs[:-1]:
        dog._update_waiting(blocked_state(dog.rank), 0)
        assert dog.registered_waiting and not dog._last_to_block
    dogs[-1]._update_waiting(blocked_state(WORLD - 1), WORLD - 1)
    assert dogs[-1]._last_to_block and job.waiting() == WORLD
    dogs[-1]._update_waiting(blocked_state(WORLD - 1), WORLD - 1)  # still blocked: it looked already, not again
    assert not dogs[-1]._last_to_block
    dogs[0]._update_waiting({"rank": 0, "status": "running", "idle_s": 0.0, "inflight": []}, WORLD)
    assert job.waiting() == WORLD - 1 and not dogs[0].registered_waiting


def test_a_rank_that_has_just_blocked_wants_a_round_now_without_touching_the_store():
    recorder = Recorder()
    dog = watchdog_module.Watchdog(recorder, Config(grace=0.5), 1, 2, None, "")  # no store: a round would fail
    now = time.monotonic()
    assert not dog._round_wanted_now(now)  # nothing in flight
    record = recorder.begin("barrier", "barrier", "0", (), sys._getframe())
    began = recorder.progress_mono  # the moments below count from it, however long this machine takes between lines
    assert not dog._round_wanted_now(began + 0.4)  # in flight, but not for grace yet
    assert dog._round_wanted_now(began + 0.6)
    dog.registered_waiting = True
    assert not dog._round_wanted_now(began + 0.6)  # registered already: the next round will do
    dog.request_dump()
    assert dog._round_wanted_now(began + 0.4)
    recorder.finish(record)


def test_a_value_that_would_build_too_much_is_left_out_before_parsing(job, monkeypatch):
    import ddpwatch.watch.state_store as store_module

    for rank in range(WORLD):
        job.publish(rank, {"rank": rank})
    monkeypatch.setattr(store_module, "READ_BUILT_FLOOR", 1 << 20)  # the same rule at a size a test can afford
    parsed = []

    class CountingJson:
        @staticmethod
        def loads(text, **kwargs):
            parsed.append(len(text))
            return json.loads(text, **kwargs)

    monkeypatch.setattr(store_module, "json", CountingJson)
    job.store._store.set(job.store.key("pos", 1), '{"rank": 1, "x": [' + "{}," * 400_000 + "{}]}")  # 1.2 MB
    assert sorted(job.positions()) == [0, 2, 3]
    assert max(parsed) < 1000  # the big value was never handed to the parser, alone or joined


def test_a_position_only_heartbeat_leaves_the_last_whole_state_standing(job):
    whole = {"rank": 1, "beat": 3, "status": "running", "inflight": [], "recent": [rec(3)]}
    job.publish(1, whole)
    job.publish(1, {"rank": 1, "beat": 4, "status": "running", "inflight": [], "recent": []}, whole=False)
    assert job.states() == {1: whole}
    assert job.positions() == {1: {"rank": 1, "beat": 4, "status": "running", "inflight": []}}


def test_a_rank_that_makes_progress_publishes_its_whole_state_every_few_seconds_one_that_stops_every_round():
    from ddpwatch.watch import rank_state

    recorder = Recorder()
    states = rank_state.StateReader(recorder, Config(), 0, 2, "node0", set())
    here = sys._getframe()

    def step():
        recorder.finish(recorder.begin("all_reduce", "all_reduce", "0", (), here))

    every = rank_state.WHOLE_EVERY_S
    step()
    doc, whole = states.heartbeat(100.0)
    assert whole and doc["recent"] and doc["site_counts"]  # the first heartbeat is whole
    seen = []
    for round_ in range(1, 2 * int(every) + 2):
        step()  # progress every round (interval 1 s)
        doc, whole = states.heartbeat(100.0 + round_)
        seen.append(whole)
        if not whole:
            assert doc["recent"] == [] and doc["site_counts"] == {} and doc["progress"] == recorder.progress
    assert seen.count(True) == len(seen) // every and not seen[0], seen
    stopped = [states.heartbeat(200.0 + round_) for round_ in range(3)]  # no progress: whole every round
    assert all(whole and doc["recent"] for doc, whole in stopped)


def test_a_beat_alone_sends_the_last_position_again_with_the_new_beat(job):
    assert job.publish_beat(1, 5) is False  # no position yet: the caller publishes a whole heartbeat instead
    job.publish(1, {"rank": 1, "beat": 4, "status": "running", "inflight": [], "recent": [rec(3)]})
    assert job.publish_beat(2, 5) is False  # another rank's position is not this one's
    assert job.publish_beat(1, 5) is True
    assert job.positions() == {1: {"rank": 1, "status": "running", "inflight": [], "beat": 5}}
    assert job.states()[1]["beat"] == 4  # the whole state stands
    assert job.leader_beat() == 0  # rank 1 is not the leader
    job.publish(0, {"rank": 0, "beat": 1})
    job.publish_beat(0, 2)
    assert job.leader_beat() == 2 and job.positions([0]) == {0: {"rank": 0, "beat": 2}}


@pytest.mark.parametrize(
    "body, beat, where, text",
    [
        ("{", 3, "}", '{"beat":3}'),
        ('{"rank":1', 3, "}", '{"rank":1,"beat":3}'),
        ('{"rank":1', None, "}", '{"rank":1}'),
        ("{", "3", "}", "{}"),
        ("{", 3, ',"inflight":[]}', '{"beat":3,"inflight":[]}'),
        ("{", None, ',"inflight":[]}', '{"inflight":[]}'),
        ('{"rank":1', 3, ',"inflight":[]}', '{"rank":1,"beat":3,"inflight":[]}'),
        ('{"rank":1', None, ',"inflight":[]}', '{"rank":1,"inflight":[]}'),
    ],
)
def test_a_beat_is_the_last_of_the_ranks_own_fields_in_valid_json(body, beat, where, text):
    assert store_module._with_beat(body, beat, where) == text
    json.loads(text)


def test_a_running_rank_sends_its_beat_alone_until_it_stops_or_its_whole_state_is_due():
    from ddpwatch import analysis
    from ddpwatch.watch import rank_state

    recorder = Recorder()
    states = rank_state.StateReader(recorder, Config(grace=0.5), 0, 2, "node0", set())
    here = sys._getframe()

    def step():
        recorder.finish(recorder.begin("all_reduce", "all_reduce", "0", (), here))

    now = lambda: recorder.progress_mono + 0.1  # within grace of the last progress
    assert not states.beat_is_enough(now())  # nothing published yet
    step()
    states.heartbeat(now())
    step()
    assert states.beat_is_enough(now())
    assert states.beat_round() == states.beat
    assert not states.beat_is_enough(now())  # no progress since that round
    step()
    assert not states.beat_is_enough(recorder.progress_mono + 0.5)  # the last progress is grace old: maybe blocked
    assert not states.beat_is_enough(recorder.progress_mono + rank_state.WHOLE_EVERY_S + 1)  # the whole state is due
    inflight = begun_ago(1.0, recorder, "barrier", "barrier", "0", (), here)
    doc, _ = states.heartbeat(recorder.progress_mono + 1.0)  # blocked: the position says where
    assert analysis.is_blocked(doc, 0.5)
    recorder.finish(inflight)
    step()
    assert not states.beat_is_enough(now())  # the standing position is a blocked one: a full heartbeat clears it


def test_a_healthy_watchdog_round_sends_the_beat_alone_and_reads_the_counter(job):
    calls = []
    job.store._store = _Counting(job.store._store, calls, with_args=True)
    recorder = Recorder()
    dog = watchdog_module.Watchdog(recorder, Config(grace=0.5), 1, WORLD, None, "")
    dog.job = job
    here = sys._getframe()
    reads, read = [], dog.states.read
    dog.states.read = lambda *args, **kwargs: reads.append(args) or read(*args, **kwargs)
    positions = []
    for _ in range(2):
        recorder.finish(recorder.begin("all_reduce", "all_reduce", "0", (), here))
        calls.clear()
        dog.tick()
        ticked = list(calls)
        positions.append(job.positions()[1])
    assert len(reads) == 1  # the first round read the state; the second built nothing
    # the beat, with this rank's completed positions (a new one this round) in the same put; then the counter;
    # then the partner's positions (rank 0's, not published here: read in one compare_set, never waited on)
    [(name, (keys, values)), (counter, _), *partner] = ticked
    assert name == "multi_set" and counter == "compare_set"
    assert keys == [job.store.key("pos", 1), job.store.key("fp", 1)]
    assert (
        positions[1]
        == dict(positions[0], beat=positions[0]["beat"] + 1)
        == canonical(values[0].encode() if isinstance(values[0], str) else bytes(values[0]), WORLD)
    )
    assert json.loads(values[1])["groups"]["0"]["ids"] == [0, 0]  # both all_reduces, one fingerprint
    key = job.store.key("fp", 0)
    assert partner == [("compare_set", (key, store_module.ABSENT, store_module.ABSENT))]


# ----- what arrives through the store is that value's problem, never the connection's (issue 27 items 4 and 5) -----


@pytest.fixture
def tcp_job():
    """A JobProtocol on a real TCPStore client (a cloned one, as the watchdog's), and the server to forge with."""
    import datetime

    import torch.distributed as dist

    from ddpwatch.launch import free_port

    port = free_port()
    server = dist.TCPStore(
        "127.0.0.1", port, None, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False
    )
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=10)).clone()
    return JobProtocol(StateStore(client, "test"), 2), server


def forge(server, key: str, value) -> None:
    """Write `value` at `key` from another connection and wait until the store holds it: TCPStore's set does not
    wait for the store's answer, so without the read after it a later call on the job's connection could arrive
    first (CI: the add meant to meet the garbage ran before it, and the read after met it instead)."""
    server.set(key, value)
    server.get(key)


@pytest.mark.parametrize("bad", [b"not a number", b"99999999999999999999999", b"\xff\xfe", b""])
def test_a_malformed_counter_reads_as_no_change_and_the_watchdog_keeps_its_store(tcp_job, bad):
    # Before: TCPStore's add(key, 0) on the value closed the connection; ddpwatch took the store for gone and stopped
    # for the rest of the job (a later real hang under action=abort was never aborted).
    job, server = tcp_job
    job.change_waiting(1)
    job.open_incident({"trigger": "deadlock"})
    assert job.counters() == (1, 1)
    forge(server, job.store.key("counters"), bad)
    assert job.counters() == (1, 1)  # no change
    job.publish(1, {"rank": 1, "beat": 2})
    assert job.positions() == {1: {"rank": 1, "beat": 2}}  # the connection still works
    assert job.change_waiting(1) == 2  # put back to the last good value, then added to
    assert job.counters() == (2, 1) and job.open_incident({"trigger": "dump"}) == 2


def test_an_add_that_fails_on_a_value_changed_meanwhile_reconnects_and_mends_it(tcp_job):
    job, server = tcp_job
    job.change_waiting(1)
    job.counters()
    forge(server, job.store.key("counters"), "garbage")  # written after this rank's last read: its add meets it
    assert job.change_waiting(1) == 2
    assert job.counters() == (2, 0) and job.positions() == {}


@pytest.mark.real
def test_a_malformed_incident_count_or_leader_beat_reads_as_nothing_new(tcp_job):
    job, server = tcp_job
    job.publish(0, {"rank": 0, "beat": 4})
    assert job.leader_beat() == 4
    forge(server, job.store.key("leader_beat"), "x")
    assert job.leader_beat() == 4
    number = job.open_incident({"trigger": "deadlock"})
    forge(server, job.store.key("incident", number, "count"), "[1]")
    assert job.collect(number, deadline=time.monotonic() + 0.2) == {}
    forge(server, job.store.key("incident", number, "acks"), "{}")
    assert job.acks(number) == 0


def test_json_nested_deeper_than_the_parser_is_left_out_without_a_traceback(job):
    # Before: RecursionError escaped store._decode_all, and the watchdog printed its traceback on every rank.
    for rank in range(WORLD):
        job.publish(rank, {"rank": rank})
    deep = "[" * 100_000 + "]" * 100_000
    job.store._store.set(job.store.key("pos", 1), deep)
    job.store._store.set(job.store.key("pos", 2), '{"a": ' * 50_000 + "1" + "}" * 50_000)
    assert sorted(job.positions()) == [0, 3]


JUNK_POSITIONS = [  # what someone on the store port may write where a rank's position or state goes
    {"rank": "1"},
    {"rank": [1]},
    {"rank": 1.5},
    {"rank": True},
    {"rank": 9999},
    {"rank": -1},
    {"rank": 1, "inflight": "x"},
    {"rank": 1, "inflight": [1, "a", None]},
    {"rank": 1, "pid": "abc", "host": None},
    {"rank": 1, "status": ["exited"]},
    {"rank": 1, "beat": {}},
    {"rank": 1, "idle_s": "a", "inflight": [{"group": 1, "seq": "x", "age_s": "y"}]},
    {
        "rank": 1,
        "idle_s": 1e308,
        "inflight": [
            {"group": "0", "seq": 1, "age_s": 1e308, "op": ["x"], "api": {}, "shapes": "s", "site": [1], "region": 5}
        ],
        "rank_condition": "c",
    },
    {"rank": 1, "pid": 2**80, "host": "HOST"},
    {"rank": 1, "stacks": "x", "process": [], "recent": {}},
]
JUNK_INCIDENT = [[], "x", {"leader": [1]}, {"leader": 0, "action": {}, "trigger": []}, {"leader": "0"}]
JUNK_VERDICT = [
    [],
    {"positions": "x", "action": "abort"},
    {"positions": {"0/1": "x"}, "action": "abort", "kinds": 5, "culprits": "x", "folder": []},
]


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("rank", [0, 1])
def test_nothing_read_from_the_store_makes_the_watchdog_log_a_traceback(job, caplog, monkeypatch, rank, blocked):
    """Issue 27: no traceback from anything read from the store. Every junk value at every key the watchdog reads,
    on the leader and on a peer, running and blocked: rounds go on, and nothing is logged with a traceback."""
    import logging
    import socket

    monkeypatch.setattr(abort, "end_process", lambda code: None)
    recorder = Recorder()
    dog = watchdog_module.Watchdog(
        recorder, Config(grace=0.5, action="abort", dead_after=1.5, interval=0.5), rank, 2, None, ""
    )
    for part in (dog, getattr(dog, "answers", None), dog.policy, dog.writer):
        if part is not None:
            part.job = job
    job.world_size = 2
    monkeypatch.setattr(
        watchdog_module.evidence if hasattr(watchdog_module, "evidence") else abort.evidence,
        "native_stacks",
        lambda pid, *args, **kwargs: {"unavailable": "test"},
    )
    if blocked:
        record = begun_ago(5.0, recorder, "all_reduce", "all_reduce", "0", (), sys._getframe())
        record.start_mono = time.monotonic()  # only the rank's progress is old: the call itself began just now
    raw = job.store._store
    host = socket.gethostname()
    caplog.set_level(logging.DEBUG, logger="ddpwatch")
    for number, doc in enumerate(JUNK_POSITIONS, 1):
        doc = {k: (host if v == "HOST" else v) for k, v in doc.items()}
        other = 1 - rank
        for kind in ("pos", "state"):
            raw.set(job.store.key(kind, other), json.dumps(doc))
        raw.set(job.store.key("counters"), str(store_module.INCIDENT_UNIT * number + 1))  # a waiting rank, an incident
        raw.set(job.store.key("incident", number, "info"), json.dumps(JUNK_INCIDENT[number % len(JUNK_INCIDENT)]))
        raw.set(job.store.key("incident", number, "verdict"), json.dumps(JUNK_VERDICT[number % len(JUNK_VERDICT)]))
        raw.set(job.store.key("incident", number, "rank", other), json.dumps(doc))
        raw.set(job.store.key("leader_beat"), json.dumps(doc))
        dog.peers.beats.clear()
        for _ in range(2):
            dog.tick()
            dog._answer_incidents()
            dog.policy.check_posted(dog.state)
            dog.peers.beats = {r: (beat, when - 10.0) for r, (beat, when) in dog.peers.beats.items()}  # silent now
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert not tracebacks, "\n".join(f"{r.getMessage()}: {r.exc_info[1]!r}" for r in tracebacks)


def caught_up_watchdog(monkeypatch, action, incident):
    """A watchdog whose thread 'runs' (its catch-up done at once, as the loop would on its wake-up) and whose store
    holds `incident` (None: no incident) as its newest."""
    dog, recorder, codes = abort_watchdog(monkeypatch, action=action)
    dog.mailbox.watching = True  # as start() has it
    monkeypatch.setattr(dog.mailbox, "wake", dog._catch_up)  # the loop's wake-up, at once
    monkeypatch.setattr(dog.job, "latest_incident", lambda: 0 if incident is None else 1)
    monkeypatch.setattr(dog.job, "incident_info", lambda number: incident)
    monkeypatch.setattr(dog.answers, "peer", lambda number, needed, since=None: False)
    return dog, recorder, codes


def test_a_peer_gone_before_this_rank_read_the_incident_its_peers_exit_on_ends_it_as_they_end(monkeypatch):
    """A loaded machine: the peers proved a p2p deadlock, posted the abort verdict and exited while this rank's
    watchdog had not read the incident yet; the rank's send failed with the peer gone and it exited 1, not 3 (the
    flight suite, test_real_p2p). The failure now has the watchdog read the newest incident first."""
    dog, recorder, codes = caught_up_watchdog(monkeypatch, "abort", {"action": "abort", "leader": 0})
    failing = recorder.begin("send", "send", "0", (), sys._getframe(), peer=0)
    with pytest.raises(Ended):
        recorder.finish(failing, RuntimeError("Connection closed by peer [127.0.0.1]:37254"))
    assert codes == [7]


@pytest.mark.parametrize(
    "action, incident, error",
    [
        ("abort", None, "Connection closed by peer"),  # a peer crashed: no incident, the error goes on
        ("abort", {"action": "report", "leader": 0}, "Connection closed by peer"),  # not under this action
        ("report", {"action": "report", "leader": 0}, "Connection closed by peer"),  # a report ends nobody
        ("abort", {"action": "abort", "leader": 0}, "shape mismatch"),  # the peer is not gone
    ],
)
def test_a_failing_collective_ends_the_rank_only_on_an_incident_under_its_own_rank_ending_action(
    monkeypatch, action, incident, error
):
    dog, recorder, codes = caught_up_watchdog(monkeypatch, action, incident)
    failing = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())
    recorder.finish(failing, RuntimeError(error))
    assert codes == []
