"""What a rank does once a verdict is out (a function per config.ACTIONS row), and the one place of its exit code."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import NamedTuple

from .. import analysis
from ..config import ABORT, REPORT, action_row, torchelastic_error_file
from ..logonce import log_once
from ..render import wording
from . import evidence, verdict
from ..terminal import say, visible
from .store import StoreUnavailable

# What a collective's error says when the rank at the other end is gone (gloo, NCCL).
PEER_FAILURE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker",
    "Broken pipe",
    "Socket Timeout",
    "NCCL communicator was aborted",
)

POLICIES: dict = {}  # action name -> its function; every row of config.ACTIONS has one (tests/test_abort.py)


def policy(name: str):
    """Register the function that carries out action `name` once its verdict is out on this rank."""

    def register(function):
        POLICIES[name] = function
        return function

    return register


class Outcome(NamedTuple):
    """A verdict out on this rank: its incident, the report's folder (None when none could be written), and
    whether this rank wrote it (the leader) or follows a peer's posted verdict."""

    number: int
    folder: str | None
    leader: bool


def write_error_file(incident: dict, logged: set) -> None:
    """torchrun's agent prints a worker's error file in its failure summary: put the verdict there."""
    path = torchelastic_error_file()
    if not path:
        return
    findings = incident.get("findings") or []
    first = findings[0] if findings else {}
    message = (
        f"ddpwatch: {first.get('kind', 'hang')}"
        + (f" (culprit {wording.rank_list(first['ranks'])})" if first.get("ranks") else "")
        + (f": {first['summary']}" if first.get("summary") else "")
        + f" Report: {incident.get('report_dir') or '(being written, or none could be written)'}"
    )
    message = visible(message)  # torchrun prints it: a peer's words must not drive the terminal
    doc = {"message": {"message": message, "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(doc, handle)  # ASCII-escaped: no string, however odd, can fail the write
    except Exception as exc:
        log_once(logged, "error-file", "ddpwatch: could not write the error file %s: %s", path, exc)


def end_process(code: int) -> None:
    try:
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(code)


IDLE, PENDING, ARMED = "idle", "pending", "armed"
ACK_WAIT_MIN_S = 10.0  # at least this long the writer waits for its peers to acknowledge an abort before it leaves
CATCH_UP_S = 1.0  # at most this long a collective's peer-gone error waits for the watchdog to read the newest incident


class AbortPolicy:
    """One rank's state machine: IDLE -> PENDING (a peer's incident under this rank's own rank-ending action is open:
    its verdict may follow) -> ARMED (a rank-ending verdict is out: a failing collective now ends the rank), or back
    to IDLE when the posted verdict is not one to act on. The leader goes from IDLE to ARMED when it says the verdict.
    """

    def __init__(self, config, rank: int, world_size: int, job, mailbox, logged: set):
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.job = job
        self.mailbox = mailbox  # its `writing`: an ending rank waits for the report; told the exit code once armed
        self.logged = logged  # the watchdog's warnings said once
        self.state = IDLE
        self.pending: int | None = None  # the incident whose verdict a PENDING rank waits for
        self.silent_peers: set = set()  # peers the verdict says are gone or stopped: no acknowledgement is awaited

    @property
    def exit_code(self) -> int:
        """The exit status of a rank this policy ends: decided here only."""
        return self.config.exit_code

    @property
    def armed(self) -> bool:
        return self.state == ARMED

    @property
    def ends_ranks(self) -> bool:
        """This rank's own action ends ranks: a peer's incident under it may end this one too (consider())."""
        return action_row(self.config.action).ends_rank

    def arm(self) -> None:
        self.state, self.pending = ARMED, None
        self.mailbox.abort_code = self.exit_code  # a launcher's SIGTERM now ends the rank with it (signals.py)

    def action_for(self, trigger: str) -> str:
        """The action of an incident this rank leads: its own configured one where the incident rests on a fact;
        a report for a dump, and for a reading (collectives that completed without matching) nobody acts on."""
        return self.config.action if analysis.acts_on(trigger) else REPORT

    # ----- the leader -----
    def verdict_out(self, incident: dict, action: str) -> None:
        """The verdict is on stderr: torchrun's summary names the first rank to exit, so under a rank-ending action
        its error file must hold the verdict before any rank can exit, and only then may a failing collective end
        this rank."""
        if action_row(action).ends_rank or _names_a_crash(incident):
            write_error_file(incident, self.logged)  # a peer the backend aborted: torchrun names this rank too
        if action_row(action).ends_rank:
            self.silent_peers = {
                rank
                for finding in incident.get("findings") or ()
                if finding.get("kind") in analysis.CANNOT_ANSWER
                for rank in finding.get("ranks") or ()
                if rank != self.rank
            }
            self.arm()

    def report_written(self, incident: dict, action: str) -> None:
        if action_row(action).ends_rank or _names_a_crash(incident):
            write_error_file(incident, self.logged)  # now with the report's folder

    def act(self, action: str, outcome: Outcome) -> None:
        POLICIES[action](self, outcome)

    # ----- a peer -----
    def consider(self, number: int, info: dict) -> None:
        """A peer opened incident `number`: wait for its verdict if it is under this rank's own rank-ending action
        (this rank's configuration decides; a peer's info cannot upgrade it)."""
        if self.state != ARMED and info.get("action") == self.config.action and self.ends_ranks:
            self.state, self.pending = PENDING, number

    def check_posted(self, own_state) -> None:
        """Act on the pending incident's verdict once it is posted, and only if it agrees with this rank's own view
        (`own_state()` gives it, read only then)."""
        number = self.pending
        if self.state != PENDING or number is None:  # PENDING comes with its incident's number (consider())
            return
        posted = self.job.verdict(number)
        if posted is None:
            return
        self.state, self.pending = IDLE, None
        if not isinstance(posted, dict):
            self.job.ack(number)  # read: the writer (perhaps the store's host) need not wait for this rank
            return
        why = verdict.why_not_act(
            posted, self.config.action, own_state(), self.rank, self.config.grace, self.config.timeout
        )
        if why is not None:
            log_once(
                self.logged,
                f"verdict-{number}",
                "ddpwatch: rank %d does not act on incident %d's abort verdict: %s",
                self.rank,
                number,
                visible(why),
            )
            self.job.ack(number)  # read and declined: the writer need not wait for this rank
            return
        folder = posted.get("folder") if isinstance(posted.get("folder"), str) else None
        write_error_file({"findings": _posted_findings(posted), "report_dir": folder}, self.logged)
        self.act(self.config.action, Outcome(number, folder, leader=False))

    # ----- a collective failing on the training thread -----
    def ends_on_failure(self, error: BaseException) -> bool:
        """Whether a failing collective ends this rank: the verdict is out, or one is pending and the peers are
        exiting on it (the error says the peer is gone). Then it ends here, not in their error."""
        return self.armed or (self.state == PENDING and peer_gone(error))

    def end_on_failure(self, on_watchdog_thread: bool) -> None:
        """End the rank; but first let the report being finished (the native-stacks pass rewrites its folder) end,
        or a staging folder is left behind."""
        if not on_watchdog_thread:
            deadline = time.monotonic() + evidence.PY_SPY_TIMEOUT_S + 2.0
            while self.mailbox.writing.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
        end_process(self.exit_code)


class CatchUp:
    """A failing collective's request to the watchdog thread: read the newest incident now.

    A peer is gone and this rank has seen no incident to wait on; under a rank-ending action the peers may be exiting
    on a verdict this rank's watchdog has not read yet (a loaded machine: the peers proved a p2p deadlock, posted
    it and exited while this rank's send was failing, and it exited 1 where they exited 3). The failing thread asks,
    waits at most CATCH_UP_S, and the policy then decides as it would have (AbortPolicy.ends_on_failure). The
    read is the watchdog's, on its thread: a store that no longer answers holds up the failing thread no longer."""

    def __init__(self, policy: AbortPolicy, mailbox):
        self.policy = policy
        self._mailbox = mailbox  # woken: the watchdog's loop reads the newest incident at once (asked, served)
        self._asked = threading.Event()
        self._done = threading.Event()

    def ends_rank_on(self, error: BaseException, may_ask: bool) -> bool:
        """(The failing thread.) Whether this failure ends the rank (AbortPolicy.ends_on_failure), once the newest
        incident has been read where a peer is gone and none was (`may_ask`: the watchdog thread runs, another one
        fails, the store answered so far)."""
        if self.policy.ends_on_failure(error):
            return True
        if not may_ask or not peer_gone(error) or self.policy.state != IDLE or not self.policy.ends_ranks:
            return False
        self._done.clear()
        self._asked.set()
        self._mailbox.wake()
        self._done.wait(CATCH_UP_S)
        return self.policy.ends_on_failure(error)

    def asked(self) -> bool:
        """(The watchdog thread, each wake-up.) Whether a failing collective asked for the newest incident to be read
        (the request is taken: call served() once it is read, or could not be)."""
        if not self._asked.is_set():
            return False
        self._asked.clear()
        return True

    def served(self) -> None:
        self._done.set()


class FailureHook:
    """(The training thread.) What a failing collective does, the recorder calling it: end the rank if the abort
    policy says so; else, a peer gone (gloo: "Connection closed by peer"), have the watchdog look for it and report
    it on its own thread, and return at once: the user's exception goes on as it would without ddpwatch (the
    program's own `except` may be writing an emergency checkpoint)."""

    def __init__(self, catch_up: CatchUp, mailbox):
        self.catch_up = catch_up
        self.mailbox = mailbox

    def __call__(self, error: BaseException) -> None:
        on_watchdog = self.mailbox.on_watchdog_thread()
        if self.catch_up.ends_rank_on(error, may_ask=not on_watchdog and self.mailbox.watching):
            self.catch_up.policy.end_on_failure(on_watchdog_thread=on_watchdog)
        if not on_watchdog and peer_gone(error):
            self.mailbox.report_peer_failure()


def _names_a_crash(incident: dict) -> bool:
    """A peer the backend aborted on a mismatch: torchrun's summary should carry this rank's verdict too."""
    return any(f.get("kind") == "mismatch_crash" for f in incident.get("findings") or ())


def peer_gone(error: BaseException) -> bool:
    return any(marker in str(error) for marker in PEER_FAILURE_MARKERS)


def _posted_findings(posted: dict) -> list:
    """The first finding, as far as a posted verdict (a peer's words, checked field by field) says it."""
    kinds = posted.get("kinds") if isinstance(posted.get("kinds"), list) else None
    culprits = posted.get("culprits") if isinstance(posted.get("culprits"), list) else None
    return [
        {
            "kind": str((kinds or ["hang"])[0]),
            "ranks": [r for r in culprits or () if type(r) is int],
            "summary": posted.get("summary") if isinstance(posted.get("summary"), str) else None,
        }
    ]


@policy(REPORT)
def keep_waiting(policy: AbortPolicy, outcome: Outcome) -> None:
    """The report is out and training goes on waiting: a later incident, or the user, decides what happens."""


@policy(ABORT)
def end_rank(policy: AbortPolicy, outcome: Outcome) -> None:
    """End this rank. Peers acknowledge having read the verdict first, so the writer (who may host the store) leaves
    last."""
    policy.arm()
    if outcome.leader:  # one line for the job: a line per rank came in whatever order the ranks happened to end in
        say(
            f"ddpwatch: ending every rank with exit code {policy.exit_code} (action={policy.config.action}); "
            f"report: {outcome.folder or '(none could be written)'}\n"
        )
    if outcome.leader:
        # The writer may host the store: once it leaves, a peer that has not read the verdict cannot, and stays hung
        # (seen once in a quiet full run: a peer of collective_stuck missed the 5 s this used to be). The wait ends
        # as soon as every peer that can read the verdict did (armed, below; or declined it, check_posted); those
        # the verdict found gone or stopped are not waited for.
        deadline = time.monotonic() + max(4 * policy.config.interval + 1.0, ACK_WAIT_MIN_S)
        expected = policy.world_size - 1 - len(policy.silent_peers)
        try:
            while time.monotonic() < deadline and policy.job.acks(outcome.number) < expected:
                time.sleep(0.05)
        except StoreUnavailable:
            pass
    else:  # armed first (above): once the writer leaves, this rank's failing collective ends it with the verdict
        try:
            policy.job.ack(outcome.number)
        except StoreUnavailable:
            pass
    os._exit(policy.exit_code)
