"""This rank's answers to incidents: its full state, and py-spy's native stacks, at a bounded cost to training.

Anyone who reaches the store's port can open an incident (raise the counter's high bits), so what answering costs
is bounded here, whoever asks: a peer's incident gets at most one answer per ANSWER_EVERY_S, and native stacks of
this process (py-spy pauses it while it reads them: 0.3-1.6 s measured) only where this rank's own view needs them
(the watchdog decides: blocked, or outside collectives for the timeout), out of a budget of NATIVE_BUDGET_S seconds
per NATIVE_WINDOW_S. An incident this rank leads (its own verdict) is answered in full, always.
"""

from __future__ import annotations

import os
import time

from . import evidence

ANSWER_EVERY_S = 1.0  # at most one answer to a peer's incident a second (the newest one: see Watchdog)
NATIVE_BUDGET_S = 2.0  # seconds of py-spy on this process per window, for peers' incidents (one read, usually)
NATIVE_WINDOW_S = 60.0


class Answers:
    """What this rank has answered, and what its answers may still cost. `states` (rank_state.StateReader) reads the
    answer; `native(pid)` reads native stacks (evidence.native_stacks); `native_on`: the native_stacks option;
    `clock` is monotonic seconds."""

    def __init__(self, job, rank: int, states, native=None, native_on: bool = True, clock=time.monotonic):
        self.job = job
        self.rank = rank
        self._states = states
        self._native = native
        self._native_on = native_on
        self._clock = clock
        self.answered = 0  # the newest incident this rank answered (its own included)
        self._last_answer = float("-inf")  # clock time of the last answer to a peer's incident
        self._native_spent: list = []  # (clock time, seconds) of each native read for a peer's incident

    # ----- an incident this rank leads: always answered -----
    def own(self, number: int, since: dict | None = None) -> None:
        """This rank's full state and Python stacks for its own incident `number` (fast: no subprocess; the writer
        reads this rank's native stacks itself, incident_writer.NativeReads); `since`: the positions it asks for."""
        if number <= self.answered:
            return
        self.answered = number
        self.job.contribute(number, self.rank, self._states.read(full=True, since=since))

    # ----- a peer's incident: bounded -----
    def peer(self, number: int, costly: bool, since: dict | None = None) -> bool:
        """Answer a peer's incident `number` unless this rank answered one within ANSWER_EVERY_S (then a later
        look answers the newest, if it is still unanswered); `costly`: with the Flight Recorder's tail (this
        rank's own view needs it); `since`: the completed positions the incident asks the answer to hold. True
        when it answered."""
        now = self._clock()
        if number <= self.answered or now - self._last_answer < ANSWER_EVERY_S:
            return False
        self._last_answer = now
        self.answered = number
        self.job.contribute(number, self.rank, self._states.read(full=True, flight_recorder=costly, since=since))
        return True

    def peer_native(self, number: int, needed: bool) -> None:
        """Native stacks for a peer's incident when this rank's own view `needed` them, within the budget; else one
        line saying why there are none."""
        if not self._native_on:  # said, so that a leader that reads its own does not wait for this rank's
            self.job.contribute_native(number, self.rank, {"unavailable": "native_stacks is off on this rank"})
            return
        if not needed:
            self.job.contribute_native(
                number,
                self.rank,
                {
                    "unavailable": (
                        "native stacks not read: this rank was neither blocked in a collective nor outside collectives "
                        "for the timeout when asked (py-spy pauses the process it reads); Python stacks only"
                    )
                },
            )
            return
        now = self._clock()
        self._native_spent = [(at, spent) for at, spent in self._native_spent if now - at < NATIVE_WINDOW_S]
        used = sum(spent for _, spent in self._native_spent)
        if used >= NATIVE_BUDGET_S:
            self.job.contribute_native(
                number,
                self.rank,
                {
                    "unavailable": (
                        f"native stacks skipped: this rank already spent {used:.1f} s reading its own in the last "
                        f"{NATIVE_WINDOW_S:.0f} s (at most {NATIVE_BUDGET_S:g} s for peers' incidents); "
                        "Python stacks only"
                    )
                },
            )
            return
        start = self._clock()
        try:
            doc = self._read_native()
        finally:
            self._native_spent.append((start, max(0.0, self._clock() - start)))
        self.job.contribute_native(number, self.rank, doc)

    def _read_native(self) -> dict:
        return (self._native or evidence.native_stacks)(os.getpid())  # looked up per call: tests replace evidence's
