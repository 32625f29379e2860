"""The abort policy: every action of config.ACTIONS has its function, one state machine decides, and a new policy is
one table row plus one function (docs/contributing.md, "Add an abort policy")."""

import ast
import glob
import json
import os
import sys

import pytest

import ddpwatch.watch.watchdog as watchdog_module
from ddpwatch import analysis, config
from ddpwatch.config import ABORT, REPORT, Action, Config
from ddpwatch.watch import abort, evidence, verdict
from ddpwatch.watch.abort import AbortPolicy, Outcome
from ddpwatch.watch.mailbox import Mailbox
from ddpwatch.capture.record import Recorder
from ddpwatch.watch.store import JobProtocol, StateStore

RUNTIME = os.path.join(os.path.dirname(abort.__file__), "*.py")


@pytest.fixture
def store():
    import torch.distributed as dist

    return dist.HashStore()


def test_every_action_has_exactly_one_policy_function():
    assert sorted(abort.POLICIES) == sorted(row.name for row in config.ACTIONS)


def test_action_names_are_spelt_only_in_config():
    """The runtime names an action through config's constants, never as a bare string."""
    names = {row.name for row in config.ACTIONS}
    spelt = []
    for path in sorted(glob.glob(RUNTIME)):
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Constant) and node.value in names:
                spelt.append(f"{os.path.basename(path)}:{node.lineno}: {node.value!r}")
    assert spelt == []


def test_the_exit_code_is_decided_in_one_place():
    assert AbortPolicy(Config(exit_code=9), 0, 2, None, Mailbox(None), set()).exit_code == 9
    body = open(abort.__file__, encoding="utf-8").read() + open(watchdog_module.__file__, encoding="utf-8").read()
    assert body.count("config.exit_code") == 1  # AbortPolicy.exit_code; every exit reads that


def test_the_leader_writes_torchruns_error_file_and_arms_only_under_a_rank_ending_action(tmp_path, monkeypatch):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    incident = {"findings": [{"kind": "deadlock", "ranks": [1], "summary": "stuck"}], "report_dir": None}
    policy = AbortPolicy(Config(action=ABORT), 0, 2, None, Mailbox(None), set())
    policy.verdict_out(incident, REPORT)
    assert not error_file.exists() and not policy.armed
    policy.verdict_out(incident, ABORT)
    assert policy.armed
    message = json.loads(error_file.read_text())["message"]["message"]
    assert message.startswith("ddpwatch: deadlock (culprit rank 1): stuck")


class Ended(Exception):
    pass


@pytest.mark.parametrize("kind", ["dead_rank", "unresponsive_rank", "deadlock"])
def test_the_writer_waits_for_the_acknowledgement_of_every_peer_but_those_the_verdict_found_gone(kind, monkeypatch):
    """Rank 0 of 3 ends after its verdict; rank 2 acknowledged, rank 1 is named by the finding. A gone or stopped
    rank cannot acknowledge: the writer leaves at once. A deadlocked one can: the writer keeps asking until the end
    of the wait (ACK_WAIT_MIN_S, on a clock of its own here)."""

    class Job:
        polls = 0

        def acks(self, number):
            Job.polls += 1
            return 1  # rank 2's

    def exit_now(code):
        raise Ended(code)

    class Clock:  # sleeping advances it: no wall-clock time passes
        now = 0.0

        def monotonic(self):
            return self.now

        def sleep(self, seconds):
            self.now += seconds

    monkeypatch.setattr(abort, "time", Clock())
    monkeypatch.setattr(abort.os, "_exit", exit_now)
    monkeypatch.setattr(abort, "say", lambda text: None)
    policy = AbortPolicy(Config(action=ABORT, interval=0.05), 0, 3, Job(), Mailbox(None), set())
    policy.verdict_out({"findings": [{"kind": kind, "ranks": [1]}]}, ABORT)
    with pytest.raises(Ended):
        abort.end_rank(policy, Outcome(1, None, True))
    expected = 1 if kind in analysis.CANNOT_ANSWER else int(abort.ACK_WAIT_MIN_S / 0.05)
    assert abs(Job.polls - expected) <= 1, Job.polls


def test_a_peer_acts_on_a_posted_verdict_only_under_its_own_rank_ending_action(store, monkeypatch):
    job = JobProtocol(StateStore(store, "t"), 2)
    acted = []
    monkeypatch.setitem(abort.POLICIES, ABORT, lambda policy, outcome: acted.append(outcome))
    own = {"rank": 1, "status": "running", "idle_s": 1.0, "inflight": [{"group": "0", "seq": 3, "age_s": 1.0}]}
    reporting = AbortPolicy(Config(action=REPORT), 1, 2, job, Mailbox(None), set())
    reporting.consider(1, {"action": ABORT, "leader": 0})
    assert reporting.state == abort.IDLE  # a peer's info never upgrades report to abort
    policy = AbortPolicy(Config(action=ABORT, grace=0.5), 1, 2, job, Mailbox(None), set())
    policy.consider(1, {"action": ABORT, "leader": 0})
    assert policy.state == abort.PENDING
    policy.check_posted(lambda: own)
    assert policy.state == abort.PENDING and acted == []  # nothing posted yet
    positions = verdict.ranges_by_position({1: own}, 2, 0.5)
    job.post_verdict(1, {"folder": "/r", "kinds": ["deadlock"], "action": ABORT, "positions": positions})
    policy.check_posted(lambda: own)
    assert acted == [Outcome(1, "/r", leader=False)] and policy.state == abort.IDLE
    # the same verdict carried out as a report (its incident rested on readings only): the peer does not act
    policy.consider(2, {"action": ABORT, "leader": 0})
    job.post_verdict(2, {"folder": "/r", "kinds": ["deadlock"], "action": REPORT, "positions": positions})
    policy.check_posted(lambda: own)
    assert acted == [Outcome(1, "/r", leader=False)] and policy.state == abort.IDLE


# ---------------------------------------------------------------- the recipe, followed with a toy policy


def test_a_new_policy_is_one_row_and_one_function(tmp_path, store, monkeypatch):
    """Follows docs/contributing.md: a `record` policy that only records the verdict, added with one row in
    config.ACTIONS and one `@abort.policy` function; a real incident (an in-process store, one rank) reaches it."""
    monkeypatch.setattr(abort, "POLICIES", dict(abort.POLICIES))  # the registration below is undone after the test
    monkeypatch.setattr(evidence, "native_stacks", lambda pid, native=True: {"unavailable": "not in unit tests"})
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)

    # The row ...
    monkeypatch.setattr(config, "ACTIONS", config.ACTIONS + (Action("record", False, "only record the verdict"),))
    recorded = []

    # ... and the function.
    @abort.policy("record")
    def record_verdict(policy, outcome):
        recorded.append(outcome)

    assert config.OPTIONS_BY_NAME["action"].parse("record") == "record"
    dog = watchdog_module.Watchdog(
        Recorder(), Config(action="record", dir=str(tmp_path)), 0, 1, StateStore(store, "toy"), "toy"
    )
    dog.run_incident(analysis.Assessment(analysis.TIMEOUT, [], "toy-1"))
    [outcome] = recorded
    assert outcome.leader and outcome.number == 1 and outcome.folder.startswith(str(tmp_path))
    assert os.path.exists(os.path.join(outcome.folder, "report.txt"))
    assert not dog.policy.armed  # not a rank-ending row: a failing collective does not end the rank
    assert dog.job.verdict(1)["action"] == "record"


class Exited(BaseException):  # not an Exception: nothing on the way may swallow it, as nothing survives os._exit
    pass


def test_a_sigterm_after_the_verdict_ends_the_rank_with_the_policys_exit_code(monkeypatch):
    """torchrun SIGTERMs the ranks still running once the first exits: after the verdict, watch/signals.py ends this one
    quietly with the abort policy's exit code (before it, the program's own handler runs)."""
    from ddpwatch.watch import signals

    dog = watchdog_module.Watchdog(Recorder(), Config(action=ABORT, exit_code=9), 0, 2, None, "")
    exits = []

    def fake_exit(code):
        exits.append(code)
        raise Exited

    monkeypatch.setattr(os, "_exit", fake_exit)
    live = signals.LiveControl(dog.mailbox)
    assert live._ending_by_verdict() is False and exits == []
    dog.policy.arm()
    with pytest.raises(Exited):
        live._ending_by_verdict()
    assert exits == [9]


# ----- torchrun's SIGTERM before this rank's collective failed: one look for a peer that crashed -----


def terminating_watchdog(monkeypatch, views):
    """A watchdog (thread not started) in a collective, whose one look finds `views` gone; its incidents noted."""
    from ddpwatch.watch import crashes

    recorder = Recorder()
    dog = watchdog_module.Watchdog(recorder, Config(action=REPORT), 0, 2, None, "")
    dog.mailbox.watching = True  # as start() has it
    looks, incidents = [], []

    def vanished(peers, job, config, stopping, own_state, linger=True):
        looks.append(stopping.is_set() and not linger)  # one look only: `stopping` is set, no lingering
        return dict(views), [{"kind": "mismatch_crash"}] if views else []

    monkeypatch.setattr(crashes, "vanished", vanished)

    class Job:
        def claim(self, fingerprint):
            return True

    dog.job = Job()
    dog.in_collective = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())  # in flight
    monkeypatch.setattr(dog, "run_incident", lambda assessment, silent=None, action=None: incidents.append(silent))
    return dog, looks, incidents


def test_a_signal_that_ends_the_rank_has_the_watchdog_publish_the_exit_on_its_own_thread():
    """signals.py asks through the mailbox (no part calls the watchdog): the watchdog's thread publishes this rank's
    exit with the signal's name, says so, and ends its loop; a request after that returns at once."""
    import threading

    published = []

    class Job:
        def publish(self, rank, doc, *more):
            published.append((rank, doc["status"], doc.get("signal"), threading.current_thread().name))

    dog = watchdog_module.Watchdog(Recorder(), Config(interval=60.0), 1, 2, None, "")
    dog.job = Job()
    dog.start()  # its first publish, RUNNING; then it sleeps for the 60 s interval
    dog.mailbox.note_ending("SIGTERM")
    assert dog.mailbox.ask_exit_published() is True
    dog.join(5.0)
    assert not dog.is_alive() and not dog.mailbox.watching
    assert published[-1] == (1, "exited", "SIGTERM", "ddpwatch-watchdog"), published
    assert dog.mailbox.ask_exit_published() is False  # nobody left to ask: no wait


def test_a_sigterm_in_a_collective_reports_a_peer_that_crashed_after_one_look(monkeypatch):
    dog, looks, incidents = terminating_watchdog(monkeypatch, {1: {"fault": {"error": "SIGABRT", "file": "f"}}})
    dog.mailbox.ask_look_for_a_vanished_peer()  # what the SIGTERM's thread asks
    assert dog.mailbox.writing.is_set(), "the SIGTERM waits for this look (signals.finish_report)"
    dog._report_peer_failure()  # what the watchdog thread's next tick does
    assert looks == [True] and incidents == [{1: {"fault": {"error": "SIGABRT", "file": "f"}}}]
    assert not dog.mailbox.writing.is_set() and not dog.mailbox.terminating.is_set()


def test_a_sigterm_reports_no_peer_that_ended_without_crashing(monkeypatch):
    """The user's Ctrl-C: torchrun SIGTERMs every rank, they end one after another; none left a fault file."""
    dog, looks, incidents = terminating_watchdog(monkeypatch, {1: {"last_state": {"rank": 1}}})
    dog.mailbox.ask_look_for_a_vanished_peer()
    dog._report_peer_failure()
    assert looks == [True] and incidents == [] and not dog.mailbox.writing.is_set()


def test_a_sigterm_outside_any_collective_asks_for_no_look(monkeypatch):
    dog, looks, incidents = terminating_watchdog(monkeypatch, {1: {"fault": {}}})
    dog.recorder.finish(dog.in_collective)
    dog.mailbox.ask_look_for_a_vanished_peer()
    assert not dog.mailbox.writing.is_set() and not dog.mailbox.terminating.is_set()


def test_the_sigterm_path_asks_the_watchdog_to_look_before_it_waits_for_a_report(monkeypatch):
    from ddpwatch.watch import signals

    calls = []

    class Asked(Mailbox):
        def ask_look_for_a_vanished_peer(self):
            calls.append("look")

    live = signals.LiveControl(Asked(None), die=lambda signum: calls.append("die"))
    monkeypatch.setattr(live, "finish_report", lambda limit=None: calls.append("wait") or True)
    monkeypatch.setattr(live, "_handles", lambda signum: True)
    live._terminate(15)
    assert calls == ["look", "wait", "die"]


def test_a_rank_a_signal_came_to_end_starts_no_look_for_a_hang_for_a_while_then_does_again():
    """Issue 41: a scheduler's SIGTERM to every rank is a stop. A rank whose program kept it alive past the window
    (a SIGHUP that reloads a configuration) is watched again."""
    from ddpwatch.watch import crashes

    mailbox = Mailbox(None)
    assert not mailbox.being_ended(crashes.ENDING_LOOK_S)
    mailbox.note_ending("SIGTERM")
    assert mailbox.being_ended(crashes.ENDING_LOOK_S)
    mailbox.ending_at -= crashes.ENDING_LOOK_S
    assert not mailbox.being_ended(crashes.ENDING_LOOK_S)


@pytest.mark.parametrize("gone_at_look", [1, 4, None])
def test_a_process_on_its_way_out_looks_again_for_the_peer_that_crashed_until_it_is_gone(gone_at_look):
    """A collective failed on a peer gone and the user's error leaves the guard (the watchdog stops): the crashed peer
    may not have vanished yet (gloo's size-mismatch abort dumps core; under load it still lived at the one look there
    was, and no report came). It is looked for again every LAST_LOOK_EVERY_S until LAST_LOOK_S, on a fake clock."""
    import threading

    from ddpwatch.watch import crashes

    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

        def pause(self, seconds):
            self.now += seconds

    class Peers:
        looks = 0

        def vanished_peers(self, positions, now):
            Peers.looks += 1
            return {1: {"silent_s": 0.0}} if gone_at_look is not None and Peers.looks >= gone_at_look else {}

    class Job:
        def positions(self):
            return {}

    stopping, clock = threading.Event(), Clock()
    stopping.set()
    silent = crashes.look_until_gone(Peers(), Job(), Config(), stopping, clock=clock, pause=clock.pause)
    if gone_at_look is None:
        assert silent == {} and clock.now >= crashes.LAST_LOOK_S  # it gave up, at the bound
        assert Peers.looks == pytest.approx(crashes.LAST_LOOK_S / crashes.LAST_LOOK_EVERY_S, abs=1.5)
    else:
        assert list(silent) == [1] and Peers.looks == gone_at_look


def test_a_peer_is_armed_before_it_acknowledges_an_abort_verdict(monkeypatch):
    """Once every peer acknowledged, the writer (perhaps the store's host) leaves and the peers' collectives fail:
    a peer must be armed by then, or its failing collective raises the user's error (exit 1, not the verdict's 3:
    seen in a quiet CI rehearsal when the acknowledgement came as the verdict was read, before arming)."""
    armed_at_ack = []

    class Job:
        def ack(self, number):
            armed_at_ack.append(policy.armed)

    def exit_now(code):
        raise Ended(code)

    monkeypatch.setattr(abort.os, "_exit", exit_now)
    policy = AbortPolicy(Config(action=ABORT), 1, 2, Job(), Mailbox(None), set())
    with pytest.raises(Ended):
        abort.end_rank(policy, Outcome(1, None, False))
    assert armed_at_ack == [True]
