"""This rank's published state: the recorder's snapshot, its wait explained, and the Flight Recorder probe."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, cast

from .. import analysis
from ..static import exits, rankcond
from ..format import build
from ..logonce import log_once
from . import evidence
from .fingerprints import FingerprintLog
from .flight import NO_FEED
from ..capture import frameworks, iterators, loaders
from ..capture.record import FLIGHT
from ..capture.sites import is_internal_file, user_frame
from ..capture.stacks import python_stacks

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import FingerprintDoc, RankState, RecordDoc

# While a rank makes progress its whole state (its last records, formatted, and its site counts) goes out this
# often; every other round sends its position only. Formatting records that are new every round was most of a
# round's cost, and while a rank moves on they are stale within the round anyway. A rank that stops moving (blocked,
# computing, dead) sends its whole state every round from then on, its records formatted once.
WHOLE_EVERY_S = 4.0


class StateReader:
    """Reads this rank's state for the watchdog; remembers what is costly to read again (one explanation per wait,
    one Flight Recorder read per doubling of the idle time)."""

    def __init__(self, recorder, config, rank: int, world_size: int, host: str, logged: set, run: str = "", feed=None):
        self.recorder = recorder
        self.run = run  # the run's identity (store.StateStore.run): each file a rank writes says which run it is of
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.host = host
        self._logged = logged  # the watchdog's warnings said once
        self.beat = 0
        self.sampler = evidence.ProcessSampler()
        self._explained: tuple = (None, (None, None))  # (the wait it was read for, (framework context, condition))
        # (progress, Flight-Recorder-only record found, idle of next read)
        self._unseen: tuple[object, RecordDoc | None, float] = (None, None, 0.0)
        self._round_progress = None  # the recorder's progress at the last heartbeat
        self._whole_at = float("-inf")  # monotonic time of the last whole heartbeat
        self._published_running = False  # the last heartbeat's state was running, not blocked
        # The positions this rank completed, which an incident's answer carries (with a feed: a watchdog's); the flight
        # feed hands them over in reads of its own, numbered by torch's count.
        self.feed = feed  # None: answers without positions (a reader no watchdog feeds)
        self.fingerprints = FingerprintLog(recorder, numbered_by_torch=feed not in (None, NO_FEED))

    def heartbeat(self, now: float) -> tuple:
        """(this round's state, whether it is whole): whole when the rank made no progress since the last round, or
        WHOLE_EVERY_S after the last whole one; else a position (no recent records, no site counts)."""
        progress = self.recorder.progress
        whole = progress == self._round_progress or now - self._whole_at >= WHOLE_EVERY_S
        self._round_progress = progress
        if whole:
            self._whole_at = now
        state = self.read(position_only=not whole)
        self._published_running = state["status"] == build.RUNNING and not analysis.is_blocked(state, self.config.grace)
        return state, whole

    def beat_is_enough(self, now: float) -> bool:
        """Whether this round may send its beat alone (JobProtocol.publish_beat): the rank ran at its last heartbeat,
        has made progress since, the last of it less than `grace` ago (so it cannot be blocked, in a recorded
        collective or in one only the Flight Recorder sees), and its whole state is not due. Building and encoding
        a state that moved on by the time it is read was most of a healthy round's cost."""
        return (
            self._published_running
            and self.recorder.progress != self._round_progress
            and now - self.recorder.progress_mono < self.config.grace
            and now - self._whole_at < WHOLE_EVERY_S
        )

    def beat_round(self) -> int:
        """Count a round that sends its beat alone; returns that beat."""
        self._round_progress = self.recorder.progress
        self.beat += 1
        return self.beat

    def read(
        self, full: bool = False, position_only: bool = False, flight_recorder: bool = True, since: dict | None = None
    ) -> RankState:
        """This rank's state now; `full` adds what an incident needs (stacks, process facts, progress bars, the
        Flight Recorder's tail unless `flight_recorder` is false: 84 of the 93 ms a full read takes at 2,000
        entries; its completed positions from `since` on, where an incident asks); `position_only` leaves out the
        finished records and site counts. Each read is a new heartbeat."""
        self.beat += 1
        recent = 32 if full else 0 if position_only else 8
        doc = build.rank_state(
            self.rank,
            self.world_size,
            pid=os.getpid(),
            host=self.host,
            beat=self.beat,
            published_at=time.time(),
            status=build.RUNNING,  # progress, records, groups ...
            **self.recorder.snapshot(recent=recent, site_counts=not position_only),
        )
        if self.run:
            doc["run"] = self.run
        self._add_unseen_collective(doc)
        if full:
            doc["stacks"] = python_stacks(skip_thread=threading.get_ident())
            doc["process"] = self.sampler.facts()
            doc["progress_bars"] = evidence.progress_bars()
            if flight_recorder:
                doc["flight_recorder"] = evidence.flight_recorder_tail()
                evidence.align_flight_recorder(doc)
            doc["epochs"] = loaders.read()  # each DataLoader's epochs and the training steps in each
            # the iterators its own code holds, and whether each had run out: how a loop was left, observed
            doc["iterators"] = iterators.main_thread_iterators(lambda path: not is_internal_file(path))
            if self.feed is not None:  # the positions completed: an incident compares them (silent.py)
                self.feed.refresh(now_or_never=True)  # the flight feed reads now, whatever its last read cost
                self.fingerprints.collect()
                mine = dict(self.fingerprints.document(since=since), rank=self.rank)
                doc["fingerprints"] = cast("FingerprintDoc", mine)
            # the loops, exits and try blocks around the lines this rank passed (static.exits): the analysis reads
            # no file, and tells a rank that left a loop by a decision from one whose data ran out with them
            doc["code"] = exits.code_of_state(doc, user_file=lambda path: not is_internal_file(path))
        self._explain_wait(doc, full)
        return doc

    def _explain_wait(self, doc: RankState, full: bool) -> None:
        """A rank waiting in a collective says what its own code was doing: the framework call behind it (Lightning's
        deferred `self.log` reduction) and the rank condition its code stands under.

        The leader decides culprits from these before it asks for stacks; read once per wait (files parse once).
        """
        record = analysis.waiting_record(doc)
        if record is None or (record.get("age_s", 0.0) < self.config.grace and not full):
            return
        key = (record["group"], record["seq"], record.get("peer"), record.get("api"))
        if self._explained[0] != key:
            self._explained = (key, self._read_wait(doc.get("stacks"), record.get("site")))
        context, condition = self._explained[1]
        if context is not None:
            record["framework"] = dict(context, stack_site=record.get("site"))
            if context.get("site"):
                record["site"] = context["site"]
        doc["rank_condition"] = condition

    def _read_wait(self, stacks, call_site) -> tuple:
        main = _main_thread_frame()
        context = None
        try:
            context = frameworks.framework_context(main)
        except Exception:
            log_once(self._logged, "framework", "ddpwatch: could not read the framework's state", exc_info=True)
        site = (context or {}).get("site")
        condition = rankcond.rank_condition_at_site(site) if site else None
        if condition is None:
            stacks = stacks or python_stacks(skip_thread=threading.get_ident())
            condition = rankcond.rank_condition_of({"stacks": stacks})
        if condition is None and call_site and call_site.get("file") and call_site.get("line"):
            # The line that issued the collective: what the stack shows no more when the main thread has gone on
            # (an async op, then 60 frames deep in an import of torch._dynamo, as funcol's first call does)
            condition = rankcond.rank_condition_at_site(call_site)
        return context, condition

    def _add_unseen_collective(self, doc: RankState) -> None:
        """No recorded collective in flight, no progress, and the training thread sits inside torch: ask the
        Flight Recorder whether c10d has an op in flight that Python never saw (compiled graphs, torch.ops, C++).

        A read costs up to ~30 ms at 2,000 entries (benchmarks.flight_recorder) and holds the GIL: one read per
        doubling of the idle time (grace, 2 grace, 4 grace...), and a found op is kept, not read again.
        """
        idle = doc.get("idle_s", 0.0)
        if doc["inflight"] or idle < self.config.grace or self.recorder.kind == FLIGHT:
            return  # the flight recorder's records are the Flight Recorder's: nothing there that they have not
        progress, found, next_read = self._unseen
        if progress != doc["progress"]:
            found, next_read = None, self.config.grace
        if found is None and idle >= next_read:
            found = self._read_unseen_collective(doc)
            next_read = min(2 * idle, idle + 30.0)
        self._unseen = (doc["progress"], found, next_read)
        if found is not None and found["start"] is not None:  # a Flight-Recorder-only record always starts
            record: RecordDoc = {**found, "age_s": round(max(0.0, time.time() - found["start"]), 4)}
            if record["age_s"] >= self.config.grace:
                doc["inflight"] = [record]

    def _read_unseen_collective(self, doc: RankState) -> RecordDoc | None:
        main = _main_thread_frame()
        if main is None or not is_internal_file(main.f_code.co_filename):
            return None  # running the user's own Python: busy, not blocked in a native wait
        entries = evidence.flight_recorder_active()
        if not entries:
            return None
        return evidence.record_from_flight_recorder(entries[0], doc, user_frame(main), time.time())


def _main_thread_frame():
    """The main thread's innermost frame now; None when it has none (or no ident: not started)."""
    ident = threading.main_thread().ident
    return None if ident is None else sys._current_frames().get(ident)
