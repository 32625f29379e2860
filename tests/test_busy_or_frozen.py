"""Busy vs frozen (issue 13 point 3, issue 18 point 3): a silent peer's psutil facts decide; hand-built facts, no processes, no torch."""

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import barrier, rank_state, states  # noqa: E402

from ddpwatch import analysis
from ddpwatch.render.wording import worded  # noqa: E402
from ddpwatch.runtime import evidence, watchdog as watchdog_module  # noqa: E402
from ddpwatch.config import Config  # noqa: E402
from ddpwatch.runtime.evidence import BUSY, FROZEN, GONE, UNKNOWN, WAITING, peer_condition  # noqa: E402


def facts(status, cpu_s=10.0, exists=True):
    return {"exists": exists, "status": status, "cpu_s": cpu_s, "rss_mb": 200.0, "threads": 9}


@pytest.mark.parametrize("now, before, seconds, expected", [
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
])
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


# ---------------------------------------------------------------- the watchdog's use of the decision

class Looks:
    """peer_process_facts replaced by a script of hand-built facts, one per look."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def __call__(self, pid):
        return self.answers.pop(0)


def quiet_watchdog(monkeypatch, answers, silent_for=20.0, rank=1, world_size=2):
    """A watchdog (never started) that has seen rank 0's heartbeat stand still for `silent_for` seconds."""
    monkeypatch.setattr(evidence, "peer_process_facts", Looks(*answers))
    monkeypatch.setattr(evidence, "native_stacks", lambda pid, native=True: {"unavailable": "not in unit tests"})
    dog = watchdog_module.Watchdog(None, Config(dead_after=3.0), rank, world_size, None, "")
    dog.peer_beats[0] = (5, time.monotonic() - silent_for)
    return dog


def gil_holder_states(host):
    """Rank 0 published last while still in the barrier it then left; rank 1 waits in the next one."""
    return states(rank_state(0, 2, inflight=[barrier(seq=1, age=5.0)], idle=5.0, host=host),
                  rank_state(1, 2, inflight=[barrier(seq=2, age=9.0)], idle=9.0, host=host))


def test_a_running_silent_peer_is_busy_and_its_stale_wait_no_longer_counts(monkeypatch):
    dog = quiet_watchdog(monkeypatch, [facts("running")])
    seen = gil_holder_states(dog.host)
    assert analysis.assess(seen, 2, 2.0, 300.0).verdict == analysis.DEADLOCK  # what the stale states alone "prove"
    silent = dog._silent_peers(seen)
    assert silent == {}
    assert seen[0]["inflight"] == [] and seen[0]["pid"] == 1000
    assert analysis.assess(seen, 2, 2.0, 300.0, silent).verdict is None
    straggler = analysis.assess(seen, 2, 2.0, 8.0, silent)
    assert straggler.verdict == analysis.TIMEOUT and straggler.findings[0]["kind"] == "straggler"
    assert straggler.findings[0]["ranks"] == [0]


def test_a_sleeping_silent_peer_using_no_cpu_is_waiting_never_unresponsive_only_a_straggler(monkeypatch):
    # Issue 18 point 3: a C call that sleeps holding the GIL (ctypes.PyDLL(None).sleep(25)) silences the heartbeat
    # of a healthy rank; it was reported unresponsive after dead_after and, with action=abort, the job was ended.
    dog = quiet_watchdog(monkeypatch, [facts("sleeping", cpu_s=10.0), facts("sleeping", cpu_s=10.0)])
    first = gil_holder_states(dog.host)
    assert dog._silent_peers(first) == {} and first[0]["inflight"] == []
    dog._peer_looks[0] = (1000, dog._peer_looks[0][1], time.monotonic() - 1.0)  # the next round, 1 s later
    second = gil_holder_states(dog.host)
    assert dog._silent_peers(second) == {} and second[0]["inflight"] == []
    assert analysis.assess(second, 2, 2.0, 300.0, {}).verdict is None
    straggler = analysis.assess(second, 2, 2.0, 8.0, {})
    assert straggler.verdict == analysis.TIMEOUT and straggler.findings[0]["kind"] == "straggler"
    assert straggler.findings[0]["ranks"] == [0]


def test_a_waiting_silent_peer_stays_busy_even_long_past_the_timeout(monkeypatch):
    dog = quiet_watchdog(monkeypatch, [facts("sleeping", cpu_s=10.0)], silent_for=1000.0)
    seen = gil_holder_states(dog.host)
    assert dog._silent_peers(seen) == {} and seen[0]["inflight"] == []  # the timeout stage words it: a straggler


def test_a_sleeping_silent_peer_whose_cpu_time_advances_is_busy(monkeypatch):
    dog = quiet_watchdog(monkeypatch, [facts("sleeping", cpu_s=10.0), facts("sleeping", cpu_s=10.9)])
    dog._silent_peers(gil_holder_states(dog.host))
    dog._peer_looks[0] = (1000, dog._peer_looks[0][1], time.monotonic() - 1.0)
    assert dog._silent_peers(gil_holder_states(dog.host)) == {}


def test_a_stopped_silent_peer_is_unresponsive_on_the_first_look(monkeypatch):
    dog = quiet_watchdog(monkeypatch, [facts("stopped")])
    seen = gil_holder_states(dog.host)
    silent = dog._silent_peers(seen)
    assert silent[0]["process"]["condition"] == FROZEN
    [finding] = map(worded, analysis.assess(seen, 2, 2.0, 300.0, silent).findings)
    assert finding["kind"] == "unresponsive_rank" and "(process status: stopped)" in finding["summary"]


def test_a_peer_that_speaks_again_starts_a_new_measurement(monkeypatch):
    dog = quiet_watchdog(monkeypatch, [facts("sleeping")])
    dog._silent_peers(gil_holder_states(dog.host))
    assert 0 in dog._peer_looks
    dog.peer_beats[0] = (4, time.monotonic())  # its beat moved: the next round sees it speaking
    dog._silent_peers(gil_holder_states(dog.host))
    assert 0 not in dog._peer_looks


def test_a_silent_peer_on_another_host_is_busy_until_the_timeout(monkeypatch):
    dog = quiet_watchdog(monkeypatch, [])  # silent 20 s, far past dead_after, far under the 300 s timeout
    seen = gil_holder_states("some-other-host")
    assert dog._silent_peers(seen) == {} and seen[0]["inflight"] == []


def test_a_local_peer_psutil_cannot_look_at_is_busy_until_the_timeout(monkeypatch):
    dog = quiet_watchdog(monkeypatch, [{"error": "AccessDenied: psutil.AccessDenied"}])
    seen = gil_holder_states(dog.host)
    assert dog._silent_peers(seen) == {}


def test_a_silent_peer_on_another_host_past_the_timeout_says_busy_cannot_be_told(monkeypatch):
    dog = quiet_watchdog(monkeypatch, [], silent_for=400.0)
    seen = gil_holder_states("some-other-host")
    silent = dog._silent_peers(seen)
    assert silent[0]["remote"] is True and "process" not in silent[0]
    [finding] = map(worded, analysis.assess(seen, 2, 2.0, 300.0, silent).findings)
    assert finding["kind"] == "dead_rank" and "is silent" in finding["summary"]
    assert "another host" in finding["summary"] and "busy" in finding["summary"] and "GIL" in finding["summary"]
