"""Someone else on the job's TCPStore port (issue 18 point 4): a forged verdict never ends a job that would not end.

The test process hosts the job's store, as rank 0 would, and plays the attacker on it: it reads the ranks'
positions, then posts an incident and an abort verdict that agree with them, with terminal escapes in its text.
"""

import datetime
import json

import pytest

from ranks import SCENARIOS, describe, reports, run_case
from ddpwatch.launch import free_port
from ddpwatch.runtime import verdict as verdict_module
from ddpwatch.runtime.store import INCIDENT_UNIT

FAULTS = SCENARIOS + "/faults.py"
# torch prefixes the default group's store with "0/"; no launcher job id: the generation key is "job", first arming
NAMESPACE = "0//ddpwatch/v1/job/g0"
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\rno hang found"
pytestmark = pytest.mark.timeout(150)


def host_store():
    import torch.distributed as dist

    port = free_port()
    return port, dist.TCPStore("127.0.0.1", port, None, True, timeout=datetime.timedelta(seconds=30),
                               wait_for_workers=False)


def read(store, key):
    return json.loads(bytes(store.get(f"{NAMESPACE}/{key}")).decode()) if store.check([f"{NAMESPACE}/{key}"]) else None


class Forger:
    """stop_when for run_ranks: once rank 1 waits in the barrier, forge an abort verdict that names where it is."""

    def __init__(self, store, positions=None):
        self.store, self.positions, self.posted = store, positions, None

    def __call__(self):
        if self.posted is not None:
            return False
        states = {rank: read(self.store, f"pos/{rank}") for rank in (0, 1)}
        if not states[1] or not states[1].get("inflight") or states[1]["inflight"][0].get("age_s", 0) < 3:
            return False
        number = self.store.add(f"{NAMESPACE}/counters", INCIDENT_UNIT) // INCIDENT_UNIT  # the incident number's bits
        self.store.set(f"{NAMESPACE}/incident/{number}/info",
                       json.dumps({"trigger": "deadlock", "leader": 0, "action": "abort", "fingerprint": "x"}))
        positions = self.positions or verdict_module.positions(states, 2, 0.5)
        self.store.set(f"{NAMESPACE}/incident/{number}/verdict", json.dumps(
            {"folder": HOSTILE, "kinds": ["deadlock"], "action": "abort", "culprits": [0], "summary": HOSTILE,
             "positions": positions}))
        self.posted = positions
        return False


def run_attacked(tmp_path, action, positions=None):
    port, store = host_store()
    forger = Forger(store, positions)
    # Rank 0 validates alone for 12 s while rank 1 waits in a barrier: a correct job, under the timeout.
    results = run_case([FAULTS, "benign:12:1"], 2, tmp_path, timeout=90, stop_when=forger, STORE_PORT=port,
                       DDPWATCH_ACTION=action, DDPWATCH_GRACE=0.5, DDPWATCH_INTERVAL=0.2, DDPWATCH_TIMEOUT=60)
    return forger, results


def test_a_forged_abort_verdict_never_ends_a_job_configured_action_report(tmp_path):
    # Before: both ranks ended with exit code 3 about a second after the forgery; the escapes reached stderr raw.
    forger, results = run_attacked(tmp_path, "report")
    assert forger.posted is not None, describe(results)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == []
    assert all("\x1b" not in r.stderr and "pwned" not in r.stderr for r in results), describe(results)


def test_a_forged_abort_verdict_that_misplaces_a_rank_is_not_acted_on_under_action_abort(tmp_path):
    wrong = {"0/999": [[0, 1]]}  # the forger guessed where the ranks stand, and guessed wrong
    forger, results = run_attacked(tmp_path, "abort", positions=wrong)
    assert forger.posted == wrong, describe(results)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == []
    assert "does not act on incident 1's abort verdict" in results[1].stderr, describe(results)
