"""The job protocol over a real in-process c10d store, and the watchdog's abort policy on a failing collective."""

import ast
import json
import sys
import time

import pytest

import ddpwatch.runtime.store as store_module
import ddpwatch.runtime.watchdog as watchdog_module
from ddpwatch.runtime import abort, incident_writer, peers
from ddpwatch.config import Config
from ddpwatch.runtime.record import Recorder
from ddpwatch.runtime.store import JobProtocol, StateStore

WORLD = 4


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
    assert sorted(calls) == ["add", "add", "multi_set", "multi_set"], calls


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
    job.publish(1, {"rank": 1, "beat": 3, "recent": [{"seq": 9}], "status": "running"})
    job.publish(1, {"rank": 1, "beat": 5, "status": "running"}, whole=False)  # later positions only
    views = {1: {"rank": 1, "beat": 6, "status": "busy"}, 2: {"rank": 2, "beat": 1}}  # rank 2 never whole
    assert job.with_history(views) == {1: {"rank": 1, "beat": 6, "status": "busy", "recent": [{"seq": 9}]},
                                       2: {"rank": 2, "beat": 1}}
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
    calls = [node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)]
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
    recorder.set_failure_hook(dog.on_collective_failure)  # what start() installs (the thread is never started here)
    return dog, recorder, codes


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
    state = {"rank": 1, "beat": 3, "status": "running", "inflight": [{"seq": 4}], "recent": [{"seq": 3}],
             "site_counts": {"a.py:1": 2}, "last_seq": {"0": 3}, "ops_recorded": 4, "rank_condition": None}
    job.publish(1, state)
    assert calls == ["multi_set"]
    job.store._store = store
    assert job.states() == {1: state}
    assert job.positions() == {1: {"rank": 1, "beat": 3, "status": "running", "inflight": [{"seq": 4}],
                                   "rank_condition": None}}


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
    assert not dog._round_wanted_now(time.monotonic())  # in flight, but not for grace yet
    assert dog._round_wanted_now(time.monotonic() + 0.6)
    dog.registered_waiting = True
    assert not dog._round_wanted_now(time.monotonic() + 0.6)  # registered already: the next round will do
    dog.request_dump()
    assert dog._round_wanted_now(time.monotonic())
    recorder.finish(record)


def test_a_value_that_would_build_too_much_is_left_out_before_parsing(job, monkeypatch):
    import ddpwatch.runtime.store as store_module

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
    whole = {"rank": 1, "beat": 3, "status": "running", "inflight": [], "recent": [{"seq": 3}]}
    job.publish(1, whole)
    job.publish(1, {"rank": 1, "beat": 4, "status": "running", "inflight": [], "recent": []}, whole=False)
    assert job.states() == {1: whole}
    assert job.positions() == {1: {"rank": 1, "beat": 4, "status": "running", "inflight": []}}


def test_a_rank_that_makes_progress_publishes_its_whole_state_every_few_seconds_one_that_stops_every_round():
    from ddpwatch.runtime import rank_state

    recorder = Recorder()
    states = rank_state.RankState(recorder, Config(), 0, 2, "node0", lambda *a, **k: None)
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
    job.publish(1, {"rank": 1, "beat": 4, "status": "running", "inflight": [], "recent": [{"seq": 3}]})
    assert job.publish_beat(2, 5) is False  # another rank's position is not this one's
    assert job.publish_beat(1, 5) is True
    assert job.positions() == {1: {"rank": 1, "status": "running", "inflight": [], "beat": 5}}
    assert job.states()[1]["beat"] == 4  # the whole state stands
    assert job.leader_beat() == 0  # rank 1 is not the leader
    job.publish(0, {"rank": 0, "beat": 1})
    job.publish_beat(0, 2)
    assert job.leader_beat() == 2 and job.positions([0]) == {0: {"rank": 0, "beat": 2}}


@pytest.mark.parametrize("body, beat, text", [("{", 3, '{"beat":3}'), ('{"rank":1', 3, '{"rank":1,"beat":3}'),
                                              ('{"rank":1', None, '{"rank":1}'), ("{", "3", "{}")])
def test_a_beat_is_appended_as_the_last_key_of_valid_json(body, beat, text):
    assert store_module._with_beat(body, beat) == text
    json.loads(text)


def test_a_running_rank_sends_its_beat_alone_until_it_stops_or_its_whole_state_is_due():
    from ddpwatch import analysis
    from ddpwatch.runtime import rank_state

    recorder = Recorder()
    states = rank_state.RankState(recorder, Config(grace=0.5), 0, 2, "node0", lambda *a, **k: None)
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
    inflight = recorder.begin("barrier", "barrier", "0", (), here)
    recorder.age_progress(1.0)
    inflight.start_mono -= 1.0
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
    [(name, (keys, values)), (counter, _)] = ticked
    assert name == "multi_set" and counter == "add" and keys == [job.store.key("pos", 1)]
    assert positions[1] == dict(positions[0], beat=positions[0]["beat"] + 1) == json.loads(values[0])
