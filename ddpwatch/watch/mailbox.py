"""What other threads and the watchdog thread tell each other: events and values, so no part is handed the watchdog.

A failing collective (the training thread) and a signal's reader thread ask for things (a look for a vanished peer,
a report now, this rank's exit published); the watchdog thread reads the requests when it wakes, decides and acts,
and says what it is doing (a report being written, an abort verdict armed). Everything here returns at once or
waits a bounded time; nothing here raises into the thread that asks.
"""

from __future__ import annotations

import contextlib
import threading
import time

EXIT_PUBLISH_S = 2.0  # how long a signal that ends the rank waits for the watchdog to publish the exit


class Mailbox:
    """The requests to one rank's watchdog and what it says back; created and owned by the Watchdog."""

    def __init__(self, recorder):
        self._recorder = recorder  # read only: whether a collective is in flight (a SIGTERM's look needs one)
        # Held except to wake the loop at once: the loop sleeps in one timed acquire of it, a single C call where
        # Event.wait ran a Condition's Python code on every wake-up (2-3 a second).
        self._wake = threading.Lock()
        self._wake.acquire()
        self.watching = False  # the watchdog thread runs and the store answers: a request will be served
        self.watchdog_thread: int | None = None  # its thread's ident: a failure there is the watchdog's own
        self.writing = threading.Event()  # a report is being collected or written: a SIGTERM waits for it
        self.dump = threading.Event()  # a report now, from every rank (SIGUSR1, `ddpwatch dump`)
        self.peer_failure = threading.Event()  # a collective failed on a peer gone: look for the one that vanished
        self.terminating = threading.Event()  # a SIGTERM asked for one look for a peer gone
        self.exit_asked = threading.Event()  # a signal ends the rank: publish its exit now
        self.exit_published = threading.Event()
        self.ending_signal = ""  # the name of a signal that came to end this process, published with the exit
        self.ending_at = float("-inf")  # when it came (monotonic)
        self.abort_code: int | None = None  # set once an abort verdict armed this rank: the exit status it ends with

    # ----- the watchdog thread -----
    def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or less if a request wakes the loop."""
        self._wake.acquire(timeout=seconds)

    def watchdog_gone(self) -> None:
        """The watchdog's loop has ended: no request is served from now on, and no one waits for one."""
        self.watching = False
        self.exit_published.set()

    def wake(self) -> None:
        """Make the loop look now instead of at the end of its sleep (any thread; never blocks)."""
        with contextlib.suppress(RuntimeError):  # released already and not yet taken: the loop wakes all the same
            self._wake.release()

    # ----- other threads -----
    def on_watchdog_thread(self) -> bool:
        return threading.get_ident() == self.watchdog_thread

    def ask_dump(self) -> None:
        """A report now, from every rank, the job going on: an event, safe in a signal handler."""
        self.dump.set()
        self.wake()

    def note_ending(self, signal_name: str) -> None:
        """A signal came to end this process: published with the rank's exit; the peers going is a stop."""
        self.ending_signal = signal_name
        self.ending_at = time.monotonic()

    def being_ended(self, within_s: float) -> bool:
        """Whether a signal that ends processes came within `within_s` seconds."""
        return bool(self.ending_signal) and time.monotonic() - self.ending_at < within_s

    def report_peer_failure(self) -> None:
        """(The training thread.) A collective failed on a peer gone: look for it and report it, on the watchdog's
        thread; torchrun's SIGTERM, sent once the peer's exit is seen, waits for that report (`writing`)."""
        if self.watching:
            self.writing.set()
        self.peer_failure.set()
        self.wake()

    def ask_look_for_a_vanished_peer(self) -> None:
        """(A SIGTERM's thread; never blocks.) One look for a peer that crashed, if this rank waits in a collective;
        `writing` is set at once, so the SIGTERM waits for the look (signals.finish_report)."""
        if self.watching and self._recorder.inflight and not self.writing.is_set():
            for event in (self.terminating, self.writing, self.peer_failure):
                event.set()
            self.wake()

    def ask_exit_published(self) -> bool:
        """(A signal's thread, the process about to die without atexit.) Have the watchdog publish this rank's exit
        and wait for it, at most EXIT_PUBLISH_S: True once published."""
        if not self.watching:
            return False
        self.exit_published.clear()
        self.exit_asked.set()
        self.wake()
        return self.exit_published.wait(EXIT_PUBLISH_S)

    def report_in_progress(self) -> bool:
        return self.writing.is_set()
