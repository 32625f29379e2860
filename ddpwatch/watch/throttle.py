"""How many incidents one rank leads and how many alerts it sends, whatever the store holds: bounded per window.

Anyone who reaches the job's store can write what starts an incident (a forged fingerprint, a forged position),
and each incident costs every rank an answer, a report folder on disk and a run of the on_incident hook. So one rank
leads at most BURST incidents, then one per REFILL_S; a reading (a trigger no rank acts on) at most one per
READING_EVERY_S, and none while the job's incident counter shows JOB_READINGS or more opened in that window (every
rank reads that counter each round: the job's own rate, which a flood raises for all). A fact is never held back by
the job's counter (a forger could raise it to hide a real hang), only by this rank's own bucket. Alerts: one hook
run per finding kind per ALERT_EVERY_S; the ones held back are counted and said with the next.
"""

from __future__ import annotations

import collections
import time

from ..logonce import log_once

BURST = 3  # incidents a rank may lead at once
REFILL_S = 20.0  # then one more per this many seconds
READING_EVERY_S = 30.0  # at most one reading-only incident (completed mismatches) per rank per this long
JOB_READINGS = 3  # no reading while the job opened this many incidents in the last READING_EVERY_S
ALERT_EVERY_S = 60.0  # one on_incident run per finding kind per this long


class IncidentThrottle:
    """This rank's budget of incidents; `logged`: the watchdog's warnings said once; `clock`: monotonic seconds."""

    def __init__(self, logged: set, clock=time.monotonic):
        self.logged = logged
        self._clock = clock
        self._tokens = float(BURST)
        self._filled_at = clock()
        self._last_reading = float("-inf")
        self._counter_seen: collections.deque = collections.deque()  # (time, the job's incident number then)
        self.held_back = 0  # incidents not started for want of budget

    def saw_counter(self, latest: int) -> None:
        """The job's incident number as read this round (every round reads it)."""
        now = self._clock()
        if not self._counter_seen or self._counter_seen[-1][1] != latest:
            self._counter_seen.append((now, latest))
        while len(self._counter_seen) > 1 and now - self._counter_seen[1][0] > READING_EVERY_S:
            self._counter_seen.popleft()

    def _job_busy(self) -> bool:
        """Whether the job opened JOB_READINGS or more incidents within the last READING_EVERY_S."""
        if len(self._counter_seen) < 2:
            return False
        return self._counter_seen[-1][1] - self._counter_seen[0][1] >= JOB_READINGS

    def allow(self, acts: bool) -> bool:
        """Whether this rank may lead one more incident now (`acts`: its trigger rests on a fact); spends it."""
        now = self._clock()
        self._tokens = min(float(BURST), self._tokens + (now - self._filled_at) / REFILL_S)
        self._filled_at = now
        reading_ok = acts or (now - self._last_reading >= READING_EVERY_S and not self._job_busy())
        if self._tokens < 1.0 or not reading_ok:
            self.held_back += 1
            log_once(
                self.logged,
                "throttle",
                "ddpwatch: an incident was held back: this rank led its share of incidents lately, or the job opened "
                "several within %g s (said once; a flood of them can come from someone else on the store's port)",
                READING_EVERY_S,
            )
            return False
        self._tokens -= 1.0
        if not acts:
            self._last_reading = now
        return True


class AlertThrottle:
    """One alert per finding kind per ALERT_EVERY_S; `clock`: monotonic seconds."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._last: dict = {}  # kind -> clock time of its last alert
        self._held: dict = {}  # kind -> alerts held back since

    def allow(self, kind: str) -> tuple:
        """(whether to alert now, how many of this kind were held back before it); counts one held back if not."""
        now = self._clock()
        if now - self._last.get(kind, float("-inf")) < ALERT_EVERY_S:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False, 0
        self._last[kind] = now
        return True, self._held.pop(kind, 0)
