"""Busy vs frozen (issue 13 point 3, issue 18 point 3): a silent peer's psutil facts decide; hand-built, no process."""

import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import barrier, rank_state, states  # noqa: E402

from ddpwatch import analysis
from ddpwatch.render.wording import worded  # noqa: E402
from ddpwatch.watch import evidence  # noqa: E402
from ddpwatch.watch.peers import PeerTracker  # noqa: E402
from ddpwatch.config import Config  # noqa: E402
from ddpwatch.watch.evidence import BUSY, FROZEN, GONE, UNKNOWN, WAITING, peer_condition  # noqa: E402


def facts(status, cpu_s=10.0, exists=True):
    return {"exists": exists, "status": status, "cpu_s": cpu_s, "rss_mb": 200.0, "threads": 9}


@pytest.mark.parametrize(
    "now, before, seconds, expected",
    [
        # Halted: runs no code whatever the counters say (SIGSTOP, a debugger's stop).
        (facts("stopped"), None, 0.0, FROZEN),
        (facts("tracing-stop"), facts("tracing-stop"), 1.0, FROZEN),
        (facts("stopped", cpu_s=11.0), facts("running", cpu_s=10.0), 1.0, FROZEN),
        (facts("dead"), None, 0.0, FROZEN),
        # Gone: no process, or a zombie (peer_process_facts reports a zombie as not existing).
        ({"exists": False}, None, 0.0, GONE),
        ({"exists": False, "status": "zombie"}, facts("running"), 1.0, GONE),
        # Busy: running now (one GIL-holding C call), or CPU time advances between the looks.
        (facts("running"), None, 0.0, BUSY),
        (facts("running", cpu_s=10.0), facts("running", cpu_s=10.0), 1.0, BUSY),  # runnable but starved of CPU
        (facts("sleeping", cpu_s=10.9), facts("sleeping", cpu_s=10.0), 1.0, BUSY),  # another thread holds the GIL
        (facts("disk-sleep", cpu_s=10.5), facts("running", cpu_s=10.0), 2.0, BUSY),  # short I/O waits while working
        # Waiting, never frozen: asleep in the kernel with (next to) no CPU, e.g. a C call that holds the GIL while it
        # sleeps (ctypes.PyDLL), slow storage (D state). It may return any moment: only the timeout may report it.
        (facts("sleeping", cpu_s=10.01), facts("sleeping", cpu_s=10.0), 1.0, WAITING),  # the store thread's ticks
        (facts("disk-sleep", cpu_s=10.0), facts("disk-sleep", cpu_s=10.0), 0.5, WAITING),
        (facts("idle", cpu_s=10.0), facts("sleeping", cpu_s=10.0), 0.5, WAITING),
        (facts("sleeping"), None, 0.0, WAITING),
        (facts("disk-sleep"), None, 0.0, WAITING),
        # psutil cannot look: today's behaviour (the watchdog keeps the rank silent).
        (None, None, 0.0, UNKNOWN),
        ({"error": "AccessDenied: psutil.AccessDenied"}, None, 0.0, UNKNOWN),
    ],
)
def test_peer_condition_from_hand_built_psutil_facts(now, before, seconds, expected):
    assert peer_condition(now, before, seconds)["condition"] == expected


def test_cpu_share_is_cpu_seconds_over_wall_seconds_and_never_negative():
    assert evidence.cpu_share(facts("running", cpu_s=12.0), facts("running", cpu_s=10.0), 4.0) == 0.5
    assert evidence.cpu_share(facts("running", cpu_s=9.0), facts("running", cpu_s=10.0), 1.0) == 0.0
    assert evidence.cpu_share(facts("running"), None, 1.0) is None
    assert evidence.cpu_share(facts("running"), facts("running"), 0.0) is None


def test_waiting_why_says_status_and_cpu_use():
    judged = peer_condition(facts("sleeping", cpu_s=10.0), facts("sleeping", cpu_s=10.0), 0.5)
    assert judged["why"] == "sleeping, 0% of a CPU over the last 0.5 s" and judged["cpu_share"] == 0.0


def test_peer_process_facts_measures_cpu_time_of_a_real_process():
    mine = evidence.peer_process_facts(os.getpid())
    assert mine["exists"] is True and mine["status"] == "running" and mine["cpu_s"] > 0


# ---------------------------------------------------------------- the peer tracker's use of the decision

HOST = "node0"
START = 1000.0  # the fake clock: rank 0's heartbeat (beat 5) was first seen then


class Looks:
    """peer_process_facts replaced by a script of hand-built facts, one per look."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def __call__(self, pid):
        return self.answers.pop(0)


def quiet_tracker(answers, rank=1, world_size=2):
    """A peer tracker that saw rank 0's heartbeat at beat 5 at START; judge it at START + the silence wanted."""
    tracker = PeerTracker(rank, world_size, HOST, Config(dead_after=3.0), look=Looks(*answers))
    tracker.silent_for(0, {"beat": 5}, START)
    return tracker


def gil_holder_states(host=HOST):
    """Rank 0 published last while still in the barrier it then left; rank 1 waits in the next one."""
    return states(
        rank_state(0, 2, inflight=[barrier(seq=1, age=5.0)], idle=5.0, host=host),
        rank_state(1, 2, inflight=[barrier(seq=2, age=9.0)], idle=9.0, host=host),
    )


def test_a_running_silent_peer_is_busy_and_its_stale_wait_no_longer_counts():
    tracker = quiet_tracker([facts("running")])
    seen = gil_holder_states()
    assert analysis.assess(seen, 2, 2.0, 300.0).verdict == analysis.DEADLOCK  # what the stale states alone "prove"
    silent = tracker.silent_peers(seen, START + 20.0)
    assert silent == {}
    assert seen[0]["inflight"] == [] and seen[0]["pid"] == 1000
    assert analysis.assess(seen, 2, 2.0, 300.0, silent).verdict is None
    straggler = analysis.assess(seen, 2, 2.0, 8.0, silent)
    assert straggler.verdict == analysis.TIMEOUT and straggler.findings[0]["kind"] == "straggler"
    assert straggler.findings[0]["ranks"] == [0]


def test_a_sleeping_silent_peer_using_no_cpu_is_waiting_never_unresponsive_only_a_straggler():
    # Issue 18 point 3: a C call that sleeps holding the GIL (ctypes.PyDLL(None).sleep(25)) silences the heartbeat
    # of a healthy rank; it was reported unresponsive after dead_after and, with action=abort, the job was ended.
    tracker = quiet_tracker([facts("sleeping", cpu_s=10.0), facts("sleeping", cpu_s=10.0)])
    first = gil_holder_states()
    assert tracker.silent_peers(first, START + 20.0) == {} and first[0]["inflight"] == []
    second = gil_holder_states()
    assert tracker.silent_peers(second, START + 21.0) == {} and second[0]["inflight"] == []  # the next round
    assert analysis.assess(second, 2, 2.0, 300.0, {}).verdict is None
    straggler = analysis.assess(second, 2, 2.0, 8.0, {})
    assert straggler.verdict == analysis.TIMEOUT and straggler.findings[0]["kind"] == "straggler"
    assert straggler.findings[0]["ranks"] == [0]


def test_a_waiting_silent_peer_stays_busy_even_long_past_the_timeout():
    tracker = quiet_tracker([facts("sleeping", cpu_s=10.0)])
    seen = gil_holder_states()
    assert tracker.silent_peers(seen, START + 1000.0) == {} and seen[0]["inflight"] == []  # a straggler, by the timeout


def test_a_sleeping_silent_peer_whose_cpu_time_advances_is_busy():
    tracker = quiet_tracker([facts("sleeping", cpu_s=10.0), facts("sleeping", cpu_s=10.9)])
    tracker.silent_peers(gil_holder_states(), START + 20.0)
    assert tracker.silent_peers(gil_holder_states(), START + 21.0) == {}
    assert tracker.looks[0][1]["cpu_s"] == 10.9  # judged against the look one second before


def test_cpu_use_is_measured_over_the_time_between_two_looks():
    tracker = quiet_tracker([facts("sleeping", cpu_s=10.0), facts("sleeping", cpu_s=10.9)])
    tracker.silent_peers(gil_holder_states(), START + 20.0)
    assert tracker.look_at_peer(0, 1000, START + 30.0)["condition"] == WAITING  # 0.9 s of CPU over 10 s


def test_a_stopped_silent_peer_is_unresponsive_on_the_first_look():
    tracker = quiet_tracker([facts("stopped")])
    seen = gil_holder_states()
    silent = tracker.silent_peers(seen, START + 20.0)
    assert silent[0]["process"]["condition"] == FROZEN and silent[0]["silent_s"] == 20.0
    [finding] = map(worded, analysis.assess(seen, 2, 2.0, 300.0, silent).findings)
    assert finding["kind"] == "unresponsive_rank" and "(process status: stopped)" in finding["summary"]


def test_a_peer_under_dead_after_is_not_looked_at():
    tracker = quiet_tracker([])  # any look would fail: no facts scripted
    assert tracker.silent_peers(gil_holder_states(), START + 2.9) == {}


def test_a_peer_that_speaks_again_starts_a_new_measurement():
    tracker = quiet_tracker([facts("sleeping")])
    tracker.silent_peers(gil_holder_states(), START + 20.0)
    assert 0 in tracker.looks
    spoke = gil_holder_states()
    spoke[0]["beat"] = 6  # its beat moved: this round sees it speaking
    tracker.silent_peers(spoke, START + 21.0)
    assert 0 not in tracker.looks


def test_a_silent_peer_on_another_host_is_busy_until_the_timeout():
    tracker = quiet_tracker([])  # silent 20 s, far past dead_after, far under the 300 s timeout
    seen = gil_holder_states("some-other-host")
    assert tracker.silent_peers(seen, START + 20.0) == {} and seen[0]["inflight"] == []


def test_a_local_peer_psutil_cannot_look_at_is_busy_until_the_timeout():
    tracker = quiet_tracker([{"error": "AccessDenied: psutil.AccessDenied"}])
    assert tracker.silent_peers(gil_holder_states(), START + 20.0) == {}


def test_a_silent_peer_on_another_host_past_the_timeout_says_busy_cannot_be_told():
    tracker = quiet_tracker([])
    seen = gil_holder_states("some-other-host")
    silent = tracker.silent_peers(seen, START + 400.0)
    assert silent[0]["remote"] is True and "process" not in silent[0]
    [finding] = map(worded, analysis.assess(seen, 2, 2.0, 300.0, silent).findings)
    assert finding["kind"] == "dead_rank" and "is silent" in finding["summary"]
    assert "another host" in finding["summary"] and "busy" in finding["summary"] and "GIL" in finding["summary"]


def test_a_frozen_peers_stack_is_read_from_outside_once(monkeypatch):
    from ddpwatch.watch.incident_writer import IncidentWriter, RankIdentity

    reads = []
    monkeypatch.setattr(
        evidence, "native_stacks", lambda pid, native=True: reads.append((pid, native)) or {"unavailable": "no py-spy"}
    )
    tracker = quiet_tracker([facts("stopped"), facts("stopped")])
    writer = IncidentWriter(
        None,
        Config(),
        RankIdentity(1, 2, HOST, ""),
        answers=None,
        policy=None,
        logged=set(),
        stopping=threading.Event(),
    )
    for now in (START + 20.0, START + 21.0):
        silent = tracker.silent_peers(gil_holder_states(), now)
        writer.read_frozen_stacks(silent)
        assert silent[0]["py_spy"] == "no py-spy"
    assert reads == [(1000, False)]
