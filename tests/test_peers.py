"""The peer tracker on a fake clock: silent, vanished, busy or frozen peers, and for how long; no threads, no store."""

from ddpwatch.config import Config
from ddpwatch.watch import evidence
from ddpwatch.watch.peers import PeerTracker, busy_state

HOST = "node0"


def peer(rank, beat=5, host=HOST, status="running", inflight=()):
    return {"rank": rank, "beat": beat, "host": host, "pid": 1000 + rank, "status": status, "inflight": list(inflight)}


class Looks:
    """psutil's facts, scripted per pid; a pid never scripted is a process psutil cannot look at."""

    def __init__(self, **by_pid):
        self.by_pid = {int(pid[1:]): facts for pid, facts in by_pid.items()}
        self.asked = []

    def __call__(self, pid):
        self.asked.append(pid)
        return self.by_pid.get(pid)


def tracker(rank=1, world_size=2, look=None, **config):
    return PeerTracker(
        rank, world_size, HOST, Config(**{"dead_after": 3.0, "interval": 0.5, **config}), look=look or Looks()
    )


def test_silence_counts_from_the_first_sight_of_a_beat_on_the_injected_clock():
    peers = tracker()
    assert peers.silent_for(0, peer(0), 100.0) == 0.0
    assert peers.silent_for(0, peer(0), 104.5) == 4.5
    assert peers.silent_for(0, peer(0, beat=6), 105.0) == 0.0  # it spoke: a new silence starts
    assert peers.silent_for(0, peer(0, beat=6), 106.0) == 1.0


def test_an_exited_peer_is_never_silent():
    peers = tracker()
    peers.silent_for(0, peer(0), 0.0)
    assert peers.silent_for(0, peer(0, status="exited"), 1000.0) == 0.0


def test_a_peer_that_never_published_is_silent_once_dead_after_has_passed():
    peers = tracker()
    assert peers.silent_peers({}, 0.0) == {}
    silent = peers.silent_peers({}, 3.0)
    assert silent == {0: {"silent_s": 3.0, "last_state": None, "never_published": True}}


def test_a_frozen_local_peer_is_silent_with_its_facts_a_busy_one_made_busy():
    look = Looks(
        p1000={"exists": True, "status": "stopped", "cpu_s": 1.0},
        p1002={"exists": True, "status": "running", "cpu_s": 1.0},
    )
    peers = tracker(rank=1, world_size=3, look=look)
    seen = {0: peer(0, inflight=[{"seq": 1}]), 2: peer(2, inflight=[{"seq": 1}])}
    assert peers.silent_peers(seen, 10.0) == {}
    assert look.asked == []  # nobody looked at under dead_after
    silent = peers.silent_peers(seen, 13.0)
    assert list(silent) == [0] and silent[0]["process"]["condition"] == evidence.FROZEN
    assert seen[2] == busy_state(peer(2)) and seen[2]["inflight"] == []  # busy: its stale wait no longer counts
    assert seen[0]["inflight"] == [{"seq": 1}]


def test_a_gone_local_peer_is_silent():
    peers = tracker(look=Looks(p1000={"exists": False}))
    peers.silent_for(0, peer(0), 0.0)
    assert peers.silent_peers({0: peer(0)}, 5.0)[0]["process"]["condition"] == evidence.GONE


def test_the_leader_is_replaced_only_when_it_and_every_rank_below_are_silent():
    peers = tracker(rank=3, world_size=4)
    lower = {1: peer(1), 2: peer(2)}
    reads = []

    def read_lower():
        reads.append(1)
        return lower

    assert not peers.leader_silent(7, read_lower, 0.0)
    assert not peers.leader_silent(7, read_lower, 2.0) and reads == []  # rank 0 spoke 2 s ago: nothing else read
    assert not peers.leader_silent(7, read_lower, 3.0)  # rank 0 silent; rank 1 just first seen
    assert not peers.leader_silent(7, read_lower, 6.0)  # rank 1 silent; rank 2 just first seen
    assert peers.leader_silent(7, read_lower, 9.0)
    lower[2] = peer(2, beat=6)
    assert not peers.leader_silent(7, read_lower, 10.0)  # rank 2 spoke: it watches, not this rank


def test_vanished_peers_gone_here_at_once_elsewhere_after_three_intervals():
    look = Looks(p1000={"exists": False})
    peers = tracker(rank=2, world_size=3, look=look)
    seen = {0: peer(0), 1: peer(1, host="elsewhere")}
    vanished = peers.vanished_peers(seen, 0.0)
    assert list(vanished) == [0] and vanished[0]["remote"] is False
    assert list(peers.vanished_peers(seen, 1.4)) == [0]
    vanished = peers.vanished_peers(seen, 1.5)
    assert sorted(vanished) == [0, 1] and vanished[1] == {
        "silent_s": 1.5,
        "last_state": seen[1],
        "process": None,
        "remote": True,
    }


def test_an_exited_or_unpublished_peer_never_vanishes():
    peers = tracker(rank=2, world_size=3, look=Looks(p1000={"exists": False}))
    assert peers.vanished_peers({0: peer(0, status="exited")}, 100.0) == {}


def test_vanished_peers_judge_the_positions_beats():
    peers = tracker(rank=0, world_size=2)
    positions = {1: peer(1, beat=5, host="elsewhere")}
    assert peers.vanished_peers(positions, 0.0) == {}
    positions = {1: peer(1, beat=6, host="elsewhere")}  # the position still moves: not vanished
    assert peers.vanished_peers(positions, 1.4) == {}
    vanished = peers.vanished_peers(positions, 2.9)  # 1.5 s (three intervals) still
    assert vanished[1]["last_state"] == positions[1] and vanished[1]["silent_s"] == 1.5
