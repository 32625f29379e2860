"""One daemon thread per rank: the loop that publishes, looks at peers and calls peers, incident_writer and abort."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import TYPE_CHECKING

from .. import analysis
from ..config import REPORT
from ..format import build
from ..logonce import log_once
from .abort import AbortPolicy, CatchUp, FailureHook, Outcome
from . import crashes
from .answers import Answers
from .fingerprints import MismatchCheck, asked_positions
from .node import relay_for
from .flight import NO_FEED
from .incident_writer import IncidentWriter, RankIdentity
from .mailbox import Mailbox
from .peers import PeerTracker
from .rank_state import StateReader
from .store import LEADER, JobProtocol, StoreUnavailable
from .throttle import IncidentThrottle

if TYPE_CHECKING:  # annotations only
    from ..format.types import RankState

log = logging.getLogger("ddpwatch")

FAST_S = 0.1  # between two looks for an incident while this rank is blocked (training waits: the GIL is free)
MIN_PAUSE_S = 0.01  # the shortest sleep between two looks: a clock that jumps cannot make the thread spin
ANSWER_FAST_S = 10.0  # how long after blocking a rank looks for incidents every FAST_S (bounded: store load)
STORE_GONE = (  # said once, when the store stops answering
    "ddpwatch: the store stopped answering (%s); no longer publishing; "
    "each rank now writes its own dump when it is stuck"
)


class Watchdog(threading.Thread):
    """Never raises into, slows, or hangs training: every failure is logged once and the watchdog steps aside."""

    def __init__(self, recorder, config, rank: int, world_size: int, store, run_tag: str, feed=None):
        super().__init__(name="ddpwatch-watchdog", daemon=True)
        self.recorder = recorder
        self.feed = feed or NO_FEED  # flight.FlightFeed where the Flight Recorder is the record: polled each wake-up
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self._logged: set = set()
        relay = relay_for(config, store, rank, world_size, recorder.groups, self._logged)  # node.py: while it runs
        self.job = JobProtocol(store, world_size, relay)  # every key and round trip on the store lives there
        self.run_tag = run_tag
        self.host = socket.gethostname()
        self.registered_waiting = False
        self.reported: set = set()
        self._stop_event = threading.Event()
        # What other threads ask of this one (a failing collective, a signal) and what it tells them: its parts are
        # given the mailbox, never this thread or a method of it.
        self.mailbox = Mailbox(recorder)
        self.throttle = IncidentThrottle(self._logged)  # how many incidents this rank may lead (throttle.py)
        self._store_ok = True
        self.states = StateReader(recorder, config, rank, world_size, self.host, self._logged, self.job.run, self.feed)
        self.peers = PeerTracker(rank, world_size, self.host, config)
        self.policy = AbortPolicy(config, rank, world_size, self.job, self.mailbox, self._logged)
        self.failure_hook = FailureHook(CatchUp(self.policy, self.mailbox), self.mailbox)
        self.answers = Answers(self.job, rank, self.states, native_on=config.native_stacks)
        self.mismatches = MismatchCheck(self.states.fingerprints, rank, world_size, lambda: recorder.groups)
        self._seen = 0  # the newest incident whose info this rank has read
        self._info: dict = {}  # and that info
        self.writer = IncidentWriter(
            self.job,
            config,
            RankIdentity(rank, world_size, self.host, run_tag),
            answers=self.answers,
            policy=self.policy,
            logged=self._logged,
            stopping=self._stop_event,
        )
        self._watched_states: dict = {}  # the peers' states of the last look that started an incident
        self._blocked_since = 0.0  # monotonic time this rank registered as waiting
        self._last_to_block = False  # this round's registration made every rank waiting

    # ----- lifecycle -----
    def stop(self, timeout: float = 5.0) -> None:
        if not self.policy.armed:  # after an abort verdict the hook stays: a failing collective still ends the rank
            self.recorder.set_failure_hook(None)
        self._stop_event.set()
        self.mailbox.wake()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        self.publish_exit()

    def start(self) -> None:
        """Publish a first state before training goes on, so a rank that dies at once is still known (pid, host)."""
        try:
            self.job.publish(self.rank, self.state())
        except Exception:
            pass  # the thread will find out, and log, on its first round
        self.recorder.set_failure_hook(self.failure_hook)
        self.mailbox.watching = True
        super().start()

    def run(self) -> None:
        """A full round every `interval`; between rounds a look (a few attribute reads) when this rank can first have
        been blocked for `grace`, so a rank just blocked publishes at once (the last to block proves a deadlock
        itself); while blocked, a look every FAST_S for an incident to answer (training waits: it slows nothing)."""
        self.mailbox.watchdog_thread = threading.get_ident()
        try:
            self._loop()
        finally:
            self.mailbox.watchdog_gone()  # however the loop ended: no other thread waits for it now

    def _loop(self) -> None:
        due = time.monotonic() + self.config.interval
        while True:
            self.mailbox.sleep(self._pause(time.monotonic(), due))
            if self._stop_event.is_set() or self.mailbox.exit_asked.is_set():
                self._last_words()
                return
            now = time.monotonic()
            try:
                self._catch_up()
                self.feed.poll(now)
                if not self._store_ok:
                    if now >= due:
                        due = now + self.config.interval
                        self.tick_local()
                elif now >= due or self._round_wanted_now(now):
                    due = now + self.config.interval
                    self.tick()
                elif self.registered_waiting and now - self._blocked_since < ANSWER_FAST_S:
                    self._answer_incidents()
                    self.policy.check_posted(self.states.read)
            except StoreUnavailable as exc:
                self._store_ok = self.mailbox.watching = False
                self._log_once("store", STORE_GONE, exc)
            except Exception:
                self._log_once("tick", "ddpwatch: watchdog error, continuing", exc_info=True)

    def _catch_up(self) -> None:
        """A failing collective asked for the newest incident (abort.CatchUp): read it now, and say so."""
        catch_up = self.failure_hook.catch_up
        if catch_up.asked():
            try:
                self._answer_incidents()
            finally:
                catch_up.served()

    def _last_words(self) -> None:
        """Stopping (the process exits): a peer's failure not yet looked at gets one look, and its report; a signal
        that ends the rank without atexit (signals.py) has its exit published here, and is told so."""
        with contextlib.suppress(Exception):  # the process is on its way out; nothing to log to
            if self.mailbox.peer_failure.is_set() and self._store_ok:
                self.mailbox.peer_failure.clear()
                self._report_peer_failure()
            if self.mailbox.exit_asked.is_set():
                self.publish_exit()

    def _pause(self, now: float, due: float) -> float:
        """Seconds to sleep before the next look: sleep, do not poll, while nothing can have blocked yet."""
        if self.registered_waiting and now - self._blocked_since < ANSWER_FAST_S:
            pause = FAST_S
        elif not self._store_ok or self.registered_waiting:
            pause = max(0.0, due - now)
        else:  # a collective in flight since the last progress is blocked at progress + grace at the earliest
            blocked_at = (self.recorder.progress_mono if self.recorder.inflight else now) + self.config.grace
            pause = max(MIN_PAUSE_S, min(due, blocked_at) - now)
        return min(pause, max(MIN_PAUSE_S, self.feed.due_in(now)))  # the flight recorder's feed: every POLL_S

    def _round_wanted_now(self, now: float) -> bool:
        """Whether something cannot wait for the next round: a dump asked for, a peer's failure, or this rank
        blocked for `grace` and not yet registered as waiting (two recorder reads: no store, no lock)."""
        blocked = bool(self.recorder.inflight) and now - self.recorder.progress_mono >= self.config.grace
        wanted = self.mailbox.dump.is_set() or self.mailbox.peer_failure.is_set()
        return wanted or (blocked and not self.registered_waiting)

    def _report_peer_failure(self) -> None:
        """Find the rank that vanished (psutil here, a stopped heartbeat elsewhere) and report it, once per set of
        ranks (crashes.vanished_incident says when); then let a SIGTERM that waits for the look go on."""
        terminating = self.mailbox.terminating
        try:
            stopping = terminating if terminating.is_set() else self._stop_event
            found = crashes.vanished_incident(
                self.peers, self.job, self.config, stopping, self.states.read, crashed_only=terminating.is_set()
            )
            if found is None:
                return
            assessment, silent = found
            if assessment.fingerprint not in self.reported and self.job.claim(assessment.fingerprint):
                self.reported.add(assessment.fingerprint)
                self.run_incident(assessment, silent, action=REPORT)  # the user's exception follows; torchrun decides
        finally:
            terminating.clear()
            self.mailbox.writing.clear()  # set by a failing collective or a SIGTERM's look, which waits for this

    # ----- without the store: each rank dumps itself -----
    def tick_local(self) -> None:
        """The store is gone: no peers to compare with, so a rank that is stuck writes its own dump for later."""
        self.recorder.poll_pending()
        self.writer.dump_if_stuck(self.states.read)

    def request_dump(self) -> None:
        """A report now, from every rank, the job going on (SIGUSR1, `ddpwatch dump`): an event, safe in a handler."""
        self.mailbox.ask_dump()

    def _log_once(self, key: str, message: str, *args, **kwargs) -> None:
        log_once(self._logged, key, message, *args, **kwargs)

    # ----- one round -----
    def tick(self) -> None:
        self.recorder.poll_pending()
        self.feed.refresh(now := time.monotonic())  # the flight feed hands the ring what finished since (when due)
        state, positions = None, self.mismatches.outgoing()
        if not (
            self.states.beat_is_enough(now) and self.job.publish_beat(self.rank, self.states.beat_round(), positions)
        ):
            state, whole = self.states.heartbeat(now)
            self.job.publish(self.rank, state, whole, positions)
        waiting, latest = self.job.counters()  # a round trip a round, as the publish and the partners' read are
        self.throttle.saw_counter(latest)
        waiting = self._update_waiting(state, waiting)
        self._answer_incidents(latest)
        self.policy.check_posted(self.states.read)
        if self.mailbox.peer_failure.is_set():
            self.mailbox.peer_failure.clear()
            self._report_peer_failure()
        if self.mailbox.dump.is_set():
            self.mailbox.dump.clear()
            self.run_incident(analysis.Assessment(analysis.DUMP, [], f"dump-{self.rank}-{time.time():.3f}"))
        elif (self._should_watch(waiting) or self._last_to_block) and not self.mailbox.being_ended(
            crashes.ENDING_LOOK_S
        ):
            self.watch()
        self._look_for_mismatch()

    def _look_for_mismatch(self) -> None:
        """Collectives completed without matching (silent.py): reported once, by the first rank to claim it."""
        found = self.mismatches.look(self.job, self.reported)
        if found is not None and self.job.claim(found[0].fingerprint):
            self._watched_states = found[1]  # each compared rank's positions, should it be too busy to answer
            self.run_incident(found[0])

    def state(self, full: bool = False, costly: bool = True) -> RankState:
        """This rank's state as published (full: with stacks, process facts, as an answer; costly: with FR's tail)."""
        return self.states.read(full, flight_recorder=costly)

    def publish_exit(self) -> None:
        """This rank's last state, EXITED, with the signal ending it if one does (stop(); signals.py before it dies)."""
        if not self._store_ok:
            return
        try:
            doc = self.state()
            doc["status"] = build.EXITED
            if self.mailbox.ending_signal:
                doc["signal"] = self.mailbox.ending_signal  # ended by it, through the program's own handler or not
            self.job.publish(self.rank, doc)
            if self.registered_waiting:
                self.job.change_waiting(-1)
                self.registered_waiting = False
        except Exception:
            pass  # the store may already be gone at shutdown; nothing to save

    def _update_waiting(self, state: RankState | None, waiting: int) -> int:
        """Register this rank as waiting (or no longer); returns the ranks waiting now (`waiting`: as read). The rank
        completing the count is the last to block: it looks at once. `state` None: a round that sent its beat alone."""
        blocked = state is not None and analysis.is_blocked(state, self.config.grace)
        self._last_to_block = False
        if blocked != self.registered_waiting:
            waiting = self.job.change_waiting(1 if blocked else -1)
            self.registered_waiting = blocked
            if blocked:
                self._blocked_since = time.monotonic()
                self._last_to_block = waiting >= self.world_size > 1
        return waiting

    # ----- who watches: rank 0, or the lowest rank whose peers below it have gone silent -----
    def _should_watch(self, waiting: int) -> bool:
        if self.world_size < 2 or (self.rank != LEADER and not self.registered_waiting):
            return False
        if self.rank == LEADER:  # its publish wrote its beat number, which the waiting ranks read
            return waiting > 0
        # Normally rank 0 watches: read its heartbeat counter only, the others' states only once it has gone silent.
        return self.peers.leader_silent(
            self.job.leader_beat(), lambda: self.job.positions(range(1, self.rank)), time.monotonic()
        )

    def watch(self) -> None:
        states = self.job.positions()  # enough for a verdict; the full states come with the incident's answers
        silent = self.peers.silent_peers(states, time.monotonic())
        self.writer.read_frozen_stacks(silent)
        self._watched_states = states  # a busy peer cannot contribute to an incident: its last state stands in
        assessment = analysis.assess(states, self.world_size, self.config.grace, self.config.timeout, silent)
        if assessment.verdict is None or assessment.fingerprint in self.reported:
            return
        self.reported.add(assessment.fingerprint)
        if not self.job.claim(assessment.fingerprint):
            return  # another rank is already writing this one
        self.run_incident(assessment, silent)

    # ----- incidents -----
    def run_incident(self, assessment, silent: dict | None = None, action: str | None = None) -> None:
        """Write one incident this rank leads, within its budget (throttle.py; not a dump), then act (abort.py)."""
        if assessment.verdict != analysis.DUMP and not self.throttle.allow(analysis.acts_on(assessment.verdict)):
            return
        action = action or self.policy.action_for(assessment.verdict)
        self.mailbox.writing.set()
        try:
            written = self.writer.write(assessment, silent, self._watched_states, action)
        finally:
            self.mailbox.writing.clear()
        if written is not None:
            folder, number, action = written
            self.policy.act(action, Outcome(number, folder, leader=True))

    def _answer_incidents(self, latest: int | None = None) -> None:
        """Answer the newest incident only (`latest`: its number, if read this round), at most one a second
        (answers.py: anyone can raise the counter), with the costly parts (native stacks, the Flight Recorder's
        tail) only where this rank's own view needs them (blocked, or outside collectives for `timeout`)."""
        if latest is None:
            latest = self.job.latest_incident()
        if latest > self._seen:
            self._seen = latest
            self._info = self.job.incident_info(latest)
            if self._info.get("leader") != self.rank:
                self.policy.consider(latest, self._info)
        if latest != self._seen or latest <= self.answers.answered or self._info.get("leader") == self.rank:
            return
        needed = self._costly_answer_needed()
        if self.answers.peer(latest, needed, asked_positions(self._info)):
            self.answers.peer_native(latest, needed)

    def _costly_answer_needed(self) -> bool:
        idle = time.monotonic() - self.recorder.progress_mono
        return analysis.is_blocked(self.state(), self.config.grace) or idle >= self.config.timeout
