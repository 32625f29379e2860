"""The abort policy: every action of config.ACTIONS has its function, one state machine decides, and a new policy is
one table row plus one function (docs/contributing.md, "Add an abort policy")."""

import ast
import glob
import json
import os

import pytest

import ddpwatch.watch.watchdog as watchdog_module
from ddpwatch import analysis, config
from ddpwatch.config import ABORT, REPORT, Action, Config
from ddpwatch.watch import abort, evidence, verdict
from ddpwatch.watch.abort import AbortPolicy, Outcome
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
    assert AbortPolicy(Config(exit_code=9), 0, 2, None, None, set()).exit_code == 9
    body = open(abort.__file__, encoding="utf-8").read() + open(watchdog_module.__file__, encoding="utf-8").read()
    assert body.count("config.exit_code") == 1  # AbortPolicy.exit_code; every exit reads that


def test_the_leader_writes_torchruns_error_file_and_arms_only_under_a_rank_ending_action(tmp_path, monkeypatch):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    incident = {"findings": [{"kind": "deadlock", "ranks": [1], "summary": "stuck"}], "report_dir": None}
    policy = AbortPolicy(Config(action=ABORT), 0, 2, None, None, set())
    policy.verdict_out(incident, REPORT)
    assert not error_file.exists() and not policy.armed
    policy.verdict_out(incident, ABORT)
    assert policy.armed
    message = json.loads(error_file.read_text())["message"]["message"]
    assert message.startswith("ddpwatch: deadlock (culprit rank 1): stuck")


def test_a_peer_acts_on_a_posted_verdict_only_under_its_own_rank_ending_action(store, monkeypatch):
    job = JobProtocol(StateStore(store, "t"), 2)
    acted = []
    monkeypatch.setitem(abort.POLICIES, ABORT, lambda policy, outcome: acted.append(outcome))
    own = {"rank": 1, "status": "running", "idle_s": 1.0, "inflight": [{"group": "0", "seq": 3, "age_s": 1.0}]}
    reporting = AbortPolicy(Config(action=REPORT), 1, 2, job, None, set())
    reporting.consider(1, {"action": ABORT, "leader": 0})
    assert reporting.state == abort.IDLE  # a peer's info never upgrades report to abort
    policy = AbortPolicy(Config(action=ABORT, grace=0.5), 1, 2, job, None, set())
    policy.consider(1, {"action": ABORT, "leader": 0})
    assert policy.state == abort.PENDING
    policy.check_posted(lambda: own)
    assert policy.state == abort.PENDING and acted == []  # nothing posted yet
    job.post_verdict(
        1, {"folder": "/r", "kinds": ["deadlock"], "positions": verdict.ranges_by_position({1: own}, 2, 0.5)}
    )
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

    class Session:
        watchdog = watchdog_module.Watchdog(Recorder(), Config(action=ABORT, exit_code=9), 0, 2, None, "")

    exits = []

    def fake_exit(code):
        exits.append(code)
        raise Exited

    monkeypatch.setattr(os, "_exit", fake_exit)
    live = signals.LiveControl(Session())
    assert live._ending_by_verdict() is False and exits == []
    Session.watchdog.policy.arm()
    with pytest.raises(Exited):
        live._ending_by_verdict()
    assert exits == [9]
