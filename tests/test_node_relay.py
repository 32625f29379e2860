"""The node relay (watch/node.py, issue 45): who relays, who leads, and how many store round trips a node makes."""

import os
import tempfile
import time

import pytest
import torch.distributed as dist

from ddpwatch.config import Config
from ddpwatch.format import build
from ddpwatch.watch import node
from ddpwatch.watch.store import INCIDENT_UNIT, JobProtocol, StateStore

TORCHRUN = {"GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"}


class CountingStore:
    """A real in-process c10d store whose every call is counted: the round trips a node makes, measured."""

    def __init__(self, store, calls=None):
        self._store = store
        self.calls: list = [] if calls is None else calls

    def clone(self):  # another connection to the same store, its calls counted with these
        return CountingStore(self._store.clone(), self.calls)

    def __getattr__(self, name):
        method = getattr(self._store, name)

        def counted(*args):
            self.calls.append(name)
            return method(*args)

        return counted


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # <tmp>/ddpwatch-<uid>/nodes/... lands here


def running(rank, beat=1):
    return {"rank": rank, "beat": beat, "status": build.RUNNING, "inflight": [], "idle_s": 0.0}


def blocked(rank, beat=1):
    record = {"seq": 3, "group": "0", "op": "all_reduce", "state": "in_flight", "age_s": 5.0}
    return {"rank": rank, "beat": beat, "status": build.RUNNING, "inflight": [record], "idle_s": 5.0}


def node_of_ranks(world: int, ranks, config=None, local_ranks=None):
    """{rank: JobProtocol} of `ranks`, one node, sharing one counted store (a job of `world` ranks, `local_ranks` a
    node: by default as many as `ranks`)."""
    counted = CountingStore(dist.HashStore())
    config = config or Config(interval=1.0, grace=0.5)
    jobs = {}
    for rank in ranks:
        store = StateStore(counted, "test")
        relay = node.NodeRelay("job", "node0", rank, config, world, {}, local_ranks or len(ranks))
        jobs[rank] = JobProtocol(store, world, relay)
    return jobs, counted


def fingerprint_doc(rank):
    """A completed-positions document as FingerprintLog.document() writes one (one all_reduce of 4 floats)."""
    signature = {"op": "all_reduce", "reduce": None, "dtypes": ["float32"], "counts": [4], "site": None}
    return {
        "v": 1,
        "n": 1,
        "groups": {"0": {"first": 0, "ids": [0], "steps": [0], "epoch": None}},
        "signatures": {"0": {**signature, "region": None, "root": None}},
        "rank": rank,
    }


def test_the_relay_is_on_where_torchrun_says_the_job_spans_nodes_and_off_elsewhere():
    assert node.relay_on("auto", 8, TORCHRUN) == (f"{os.uname().nodename}-0", 4)
    assert node.relay_on("auto", 4, TORCHRUN) is None  # one node: every rank is local
    assert node.relay_on("on", 4, TORCHRUN) is not None
    assert node.relay_on("off", 8, TORCHRUN) is None
    assert node.relay_on("on", 8, {}) is None  # not under torchrun: where the rank runs is not said
    assert node.relay_on("auto", 8, {**TORCHRUN, "LOCAL_WORLD_SIZE": "1"}) is None  # a node of one rank
    assert node.relay_on("auto", 8, {**TORCHRUN, "GROUP_RANK": "x"}) is None


def test_the_ranks_read_by_others_are_each_groups_two_lowest():
    assert node.read_by_others(0, {}, 8) and node.read_by_others(1, {}, 8)  # rank 1: rank 0's partner
    assert not node.read_by_others(5, {}, 8)
    assert node.read_by_others(5, {"dp": [5, 13, 21]}, 24)  # the lowest of its data-parallel group
    assert node.read_by_others(13, {"dp": [5, 13, 21]}, 24)
    assert not node.read_by_others(21, {"dp": [5, 13, 21]}, 24)


def test_the_lowest_live_fresh_rank_leads_and_a_dead_or_stale_one_is_replaced(monkeypatch):
    jobs, _ = node_of_ranks(8, [0, 1, 2])
    for rank, job in jobs.items():
        job.publish(rank, running(rank))
    relay = jobs[2].relay
    assert relay.leader() == 0
    old = time.time() - 10  # rank 0's file not written for 10 rounds: it hangs or is stopped
    os.utime("r0.json", (old, old), dir_fd=relay.folder)
    assert relay.leader() == 1
    monkeypatch.setattr(node, "_exists", lambda pid: False)  # rank 1's process is gone (its file still fresh)
    monkeypatch.setattr(node, "_start_time", lambda pid: None)
    assert relay.leader() == 2


def test_a_healthy_node_makes_one_round_trip_a_round_for_all_its_running_ranks():
    """8 running ranks of one node: their beats go to files; the leader reads the counters once and the one
    partner's document (rank 0's, which rank 0 itself puts: it is read by others) for all of them."""
    jobs, counted = node_of_ranks(16, range(8, 16))
    for rank, job in jobs.items():
        job.publish(rank, running(rank))  # a first position: publish_beat resends it
    counted.calls.clear()
    for rank, job in jobs.items():
        job.publish_beat(rank, 2)
        job.counters()
        job.fingerprints([0])  # the partner each reads (the next round's leader reads it for all)
    assert counted.calls == ["add", "compare_set"], "the counters made (once) and read by the leader alone"
    counted.calls.clear()
    for rank, job in jobs.items():
        job.publish_beat(rank, 3)
        job.counters()
    assert counted.calls == ["compare_set", "compare_set"], "the counters and rank 0's document, once for the node"


def test_while_a_rank_waits_the_node_puts_every_running_rank_position_in_one_round_trip():
    jobs, counted = node_of_ranks(16, range(8, 12))
    for rank, job in jobs.items():
        job.publish(rank, running(rank))  # its first position: in the store at once
    counted.calls.clear()
    jobs[8].store.add(jobs[8].store.key("counters"), 1)  # a rank somewhere waits: rank 0 watches
    for _ in range(2):  # the first round reads that someone waits, the second puts for the watcher
        for rank, job in jobs.items():
            job.publish_beat(rank, 5)
            job.counters()
    watcher = JobProtocol(StateStore(dist.HashStore(), "other"), 16)
    watcher.store = jobs[8].store
    assert {r: p["beat"] for r, p in watcher.positions(range(8, 12)).items()} == {8: 5, 9: 5, 10: 5, 11: 5}
    assert counted.calls.count("multi_set") == 1, "the second round put the node's 4 positions in one round trip"


def test_a_rank_blocked_in_a_collective_or_exited_puts_its_own_at_once():
    jobs, counted = node_of_ranks(16, [8, 9])
    counted.calls.clear()
    jobs[9].publish(9, blocked(9))
    assert counted.calls == ["multi_set"], "a hang's evidence never waits for the node's leader"
    assert jobs[9].positions([9])[9]["inflight"]
    jobs[9].publish(9, {**running(9), "status": build.EXITED})
    assert jobs[9].relay is None, "an exited rank leaves the relay"


def test_a_running_rank_reads_the_counters_and_partners_its_leader_posted():
    jobs, _ = node_of_ranks(16, [8, 9])
    leader_store = jobs[8].store
    leader_store.put(leader_store.key("fp", 0), fingerprint_doc(0))
    leader_store.add(leader_store.key("counters"), 3 * INCIDENT_UNIT)
    for _ in range(3):  # a first position goes to the store; then the leader learns whom its ranks read, and reads
        for rank, job in jobs.items():
            job.publish(rank, running(rank))
            job.counters()
            job.fingerprints([0])
    assert jobs[9].counters() == (0, 3)
    assert jobs[9].fingerprints([0]) == {0: fingerprint_doc(0)}


def test_blocked_ranks_look_for_incidents_through_their_blocked_leaders_fresh_post(monkeypatch):
    """A hang: every rank of the node blocked, each looking for an incident ten times a second. The leader reads the
    counters for the node at each of its looks; the others read its post while it is fresh (node.FRESH_POST_S), the
    store once it is not (a leader that runs posts once a round)."""
    jobs, counted = node_of_ranks(16, [8, 9, 10])
    for rank, job in jobs.items():
        job.publish(rank, blocked(rank))  # blocked: each puts its own position, the relay carries none of it
    leader_store = jobs[8].store
    leader_store.add(leader_store.key("counters"), 2 * INCIDENT_UNIT)  # incident 2 opened elsewhere
    clock = [1000.0]
    monkeypatch.setattr(node.time, "time", lambda: clock[0])
    counted.calls.clear()
    for _ in range(10):  # a second of looks, every 0.1 s
        for job in jobs.values():
            assert job.counters()[1] == 2
        clock[0] += 0.1
    trips = [call for call in counted.calls if call != "set_timeout"]  # set_timeout: a client made, no round trip
    assert len(trips) == 1 + 10, f"the counters made once, then one read a look, the leader's alone: {trips}"
    counted.calls.clear()
    for rank in (9, 10):
        clock[0] += node.FRESH_POST_S + 0.01  # the leader has stopped posting: its last post is stale
        assert jobs[rank].counters()[1] == 2
    trips = [call for call in counted.calls if call != "set_timeout"]
    assert len(trips) == 2, f"each reads the store itself: {trips}"


class NodeClock:
    """node.py's clock, stepped by the test: the post's freshness (time) and the leader's put pace (monotonic)."""

    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now

    def monotonic(self):
        return self.now


def blocked_node(monkeypatch, ranks, leader_beat=None, world=16):
    """(jobs, counted, clock): a node of `ranks` all blocked, each having put its own news (newly blocked), rank 0's
    beat number at `leader_beat` if given, node.py on a clock the test steps."""
    clock = NodeClock()
    monkeypatch.setattr(node, "time", clock)
    jobs, counted = node_of_ranks(world, ranks)
    store = jobs[ranks[0]].store
    store.add(store.key("counters"), len(ranks))  # these ranks wait
    if leader_beat is not None:
        store.put(store.key("leader_beat"), leader_beat)
    for rank, job in jobs.items():
        job.publish(rank, blocked(rank, 1))  # newly blocked: each puts its own, at once
    return jobs, counted, clock


def hang_rounds(jobs, clock, rounds, first_beat=2):
    """`rounds` rounds of a hang on one node as the watchdogs make them: each blocked rank's round (it publishes its
    position, reads the counters and rank 0's beat number) at its own moment of the second, and every rank's looks
    for an incident ten times a second (lowest rank first) in between."""
    looks_between = 10 // len(jobs)
    for beat in range(first_beat, first_beat + rounds):
        for rank, job in jobs.items():
            job.publish(rank, blocked(rank, beat))
            job.counters()
            job.leader_beat()
            for _ in range(looks_between):
                clock.now += 0.1
                for each in jobs.values():
                    each.counters()
        clock.now += 0.1 * (10 - looks_between * len(jobs))


def test_in_a_hang_the_blocked_leader_carries_its_blocked_ranks_beats_in_at_most_two_puts_a_round(monkeypatch):
    """A hang's steady load per node, not per rank: once each blocked rank has put its own news (newly blocked),
    the node's leader, blocked too and looking ten times a round, puts their positions for them, at most twice a
    round, and reads rank 0's beat number for them; the watching rank still sees every beat move."""
    jobs, counted, clock = blocked_node(monkeypatch, [8, 9, 10], leader_beat=7)
    hang_rounds(jobs, clock, 1)  # the leader learns that ranks wait, and whom to read
    counted.calls.clear()
    hang_rounds(jobs, clock, 4, first_beat=3)
    calls = [c for c in counted.calls if c != "set_timeout"]
    assert calls.count("multi_set") <= 2 * 4, f"at most two puts a round for the node: {calls}"
    assert calls.count("multi_set") >= 4, "the beats still reach the store every round"
    assert "compare_set" not in calls, f"no rank reads rank 0's beat or the counters itself: {calls}"
    assert len(calls) <= 4 * (2 + 10), f"a round costs the node a read a look and two puts: {calls}"
    assert jobs[10].leader_beat() == 7
    beats = {r: p["beat"] for r, p in jobs[8].positions([8, 9, 10]).items()}
    assert min(beats.values()) >= 5, f"the last round's beats, or the one before: {beats}"


@pytest.mark.parametrize("world, reads", [(16, 16), (8 * (node.JOB_LOOKS_PER_S // 10), 16), (65536, 4), (131072, 2)])
def test_the_blocked_leaders_of_a_job_of_many_nodes_read_the_store_less_often_and_their_posts_stay_fresh(
    monkeypatch, world, reads
):
    """Two seconds of a hang's looks (16 here, 0.125 s apart: exact in binary) on one node of 8 in jobs of 2 to 16,384
    nodes: its leader reads the store at each look while the job's nodes' ten looks a second fit
    node.JOB_LOOKS_PER_S, then every nodes / that seconds (8,192 nodes: every 0.5 s), taking its own post between;
    its ranks never read the store: the post stays fresh three reads long."""
    jobs, counted, clock = blocked_node(monkeypatch, list(range(8, 16)), leader_beat=1, world=world)
    hang_rounds(jobs, clock, 2)  # the leader learns that ranks wait and reads rank 0's beat; the ranks go through it
    clock.now = 2000.0
    counted.calls.clear()
    for _ in range(16):
        for job in jobs.values():
            job.counters()
        clock.now += 0.125
    reads_made = [c for c in counted.calls if c not in ("set_timeout", "multi_set")]  # multi_set: the carried beats
    assert reads_made == ["multi_get"] * reads, reads_made


def test_a_leader_of_a_job_of_many_nodes_whose_post_is_missing_reads_the_store_at_once(monkeypatch):
    jobs, counted, clock = blocked_node(monkeypatch, list(range(8, 16)), leader_beat=1, world=131072)
    hang_rounds(jobs, clock, 2)
    clock.now = 2000.0
    jobs[8].counters()  # a read
    clock.now += 0.125  # a look well inside its 1 s between reads
    counted.calls.clear()
    jobs[8].counters()
    assert "multi_get" not in counted.calls, "its own post stands in"
    os.unlink(os.path.join(tempfile.gettempdir(), f"ddpwatch-{os.getuid()}", "nodes", "job", "node0", node.RELAY_FILE))
    counted.calls.clear()
    jobs[8].counters()  # no post (its last read failed, or it has just come to lead): it reads now
    assert [c for c in counted.calls if c != "set_timeout"] == ["multi_get"]


def test_a_blocked_rank_puts_its_own_when_newly_blocked_elsewhere_or_its_leaders_post_is_stale(monkeypatch):
    jobs, counted, clock = blocked_node(monkeypatch, [8, 9])
    hang_rounds(jobs, clock, 2)
    counted.calls.clear()
    moved = blocked(9, 9)
    moved["inflight"] = [{**moved["inflight"][0], "seq": 4}]  # blocked in the next collective: news
    jobs[9].publish(9, moved)
    assert counted.calls == ["multi_set"], "blocked somewhere new: its own put, at once"
    assert jobs[8].positions([9])[9]["inflight"][0]["seq"] == 4
    counted.calls.clear()
    jobs[9].publish(9, {**moved, "beat": 10})
    assert counted.calls == [], "the same place, the leader's post fresh: the leader carries it"
    clock.now += node.FRESH_POST_S + 0.01  # the leader stopped looking (stopped, hung): its post goes stale
    jobs[9].publish(9, {**moved, "beat": 11})
    assert counted.calls == ["multi_set"], "no fresh post: it puts its own again"
    assert jobs[8].positions([9])[9]["beat"] == 11


def test_a_blocked_rank_reads_rank_0s_beat_from_the_store_when_no_fresh_post_gave_it(monkeypatch):
    jobs, counted, clock = blocked_node(monkeypatch, [8, 9], leader_beat=4)
    store = jobs[8].store
    hang_rounds(jobs, clock, 1)
    store.put(store.key("leader_beat"), 5)
    jobs[8].counters()  # the leader's look reads 5 and posts it
    counted.calls.clear()
    jobs[9].counters()
    assert jobs[9].leader_beat() == 5 and counted.calls == [], "from the post"
    assert jobs[9].leader_beat() == 5 and counted.calls == ["compare_set"], "no counters read since: the store"
    counted.calls.clear()
    clock.now += node.FRESH_POST_S + 0.01
    store.put(store.key("leader_beat"), 6)
    jobs[9].publish(9, blocked(9, 5))  # its next round: no fresh post, so it puts its own and reads the store
    jobs[9].counters()
    assert jobs[9].leader_beat() == 6, "a stale post is not taken: the counters and rank 0's beat from the store"


def test_the_leader_puts_no_key_outside_the_job_and_reads_no_post_that_is_not_one():
    jobs, counted = node_of_ranks(16, [8, 9])
    relay = jobs[8].relay
    forged = {8: {"rank": 8, "direct": False, "read_by_others": True, "docs": {"elsewhere/fp/3": "{}"}}}
    assert relay.to_put(forged, True, jobs[8].store.namespace) == {}
    assert relay.read_post({"counters": "7", "fingerprints": {"0": {"rank": 1}}}, 16) == (None, {})
    assert relay.read_post({"counters": 7, "fingerprints": {"0": fingerprint_doc(0)}}, 16) == (
        7,
        {0: fingerprint_doc(0)},
    )


def test_once_its_keys_are_there_a_healthy_node_round_is_one_multi_get_and_a_deleted_key_costs_one_short_wait(
    monkeypatch,
):
    from ddpwatch.watch import state_store

    monkeypatch.setattr(state_store, "QUICK_WAIT_S", 0.05)
    jobs, counted = node_of_ranks(16, range(8, 12))
    store = jobs[8].store
    store.put(store.key("fp", 0), fingerprint_doc(0))  # rank 0's completed positions, which every rank reads
    store.add(store.key("counters"), 0)

    def round_():
        for rank, job in jobs.items():
            job.publish(rank, running(rank))
            job.counters()
            job.fingerprints([0])

    for _ in range(3):  # first positions; whom the ranks read; the keys seen there
        round_()
    counted.calls.clear()
    round_()
    assert [c for c in counted.calls if c != "set_timeout"] == ["multi_get"]
    assert jobs[11].fingerprints([0]) == {0: fingerprint_doc(0)}
    counted._store.delete_key(store.key("fp", 0))  # someone on the port deletes it: the multi_get would wait
    counted.calls.clear()
    started = time.monotonic()
    round_()
    assert time.monotonic() - started < 2.0, "one short wait, then the keys read one by one"
    assert [c for c in counted.calls if c != "set_timeout"] == ["multi_get", "compare_set", "compare_set"]
    assert jobs[8].counters() == (0, 0)


def test_a_live_lower_rank_is_checked_by_signal_and_its_start_time_asked_again_now_and_then(monkeypatch):
    """The leader check runs every round on every rank: a pid is probed by signal 0, and its start time read again
    once in CHECK_EVERY rounds, so a pid reused by another process (another start time) stops leading then."""
    jobs, _ = node_of_ranks(8, [0, 1])
    for rank, job in jobs.items():
        job.publish(rank, running(rank))
    relay = jobs[1].relay
    starts = []
    real = node._start_time
    monkeypatch.setattr(node, "_start_time", lambda pid: starts.append(pid) or real(pid))
    assert all(relay.leader() == 0 for _ in range(node.CHECK_EVERY))
    assert len(starts) == 1, "read once, then probed by signal"
    monkeypatch.setattr(node, "_start_time", lambda pid: 1.0)  # the pid now names another process
    assert relay.leader() == 1, "its start time asked again: another process, so rank 0 no longer leads"
