"""The signals of a live, armed rank: SIGUSR1 for a report now, SIGTERM that lets a report being written end; the
rank's entry in the registry `ddpwatch dump` reads (registry.py) while the handlers are installed."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Callable

from ..registry import register, unregister

log = logging.getLogger("ddpwatch")

TERM_GRACE_S = 3.0  # the longest a SIGTERM waits for a report being written
# Signals that end a process (by default, or through the program's own handler): a rank that exits after one was
# ended by it, and says so when it publishes its exit (it skipped nothing: someone ended it).
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# ----- signals while armed -----


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _default_disposition(signum: int) -> None:
    """Give `signum` back its default action; from a thread other than the main one signal.signal() refuses."""
    if _is_main_thread():
        signal.signal(signum, signal.SIG_DFL)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signum, None)  # SIG_DFL is the null handler


class LiveControl:
    """SIGUSR1 and SIGTERM handlers for one armed session, installed from the main thread, restored on stop().

    A rank that hangs sits in a collective inside C++, and Python runs signal handlers only between bytecodes of
    the main thread: a plain handler would wait for the collective to time out. So the C-level handler also writes
    the signal number to a wakeup pipe (signal.set_wakeup_fd), which a small thread reads: a dump is requested, or
    the process ends, while the main thread is still blocked. What the handlers ask of the watchdog goes through its
    mailbox (mailbox.py): a request, and a bounded wait for what it says back.
    """

    def __init__(self, mailbox, die=None):
        self.mailbox = mailbox
        self.pid = os.getpid()
        self.previous: dict = {}
        self._die_impl = die or self._die
        self._read_fd = self._write_fd = -1
        self._old_wakeup_fd = -1
        self._thread = None
        self._dying = threading.Lock()
        self._term_taken = False  # set when the main thread ran ddpwatch's SIGTERM handler itself
        self.registry_path = None

    # ----- install / remove -----
    def start(self, registry_entry: dict | None = None) -> bool:
        """Install the handlers; False (and nothing changed) when this is not the main thread."""
        if not _is_main_thread():
            log.info("ddpwatch: armed outside the main thread: no SIGUSR1 dump, no SIGTERM grace")
            return False
        self._install(signal.SIGUSR1, self._on_usr1)
        self._install(signal.SIGTERM, self._on_term)
        if signal.SIGUSR1 in self.previous or signal.SIGTERM in self.previous:
            self._start_wakeup_thread()
        if signal.SIGUSR1 in self.previous and registry_entry is not None:
            self.registry_path = register(registry_entry)
        return True

    def _install(self, signum: int, handler) -> None:
        previous = signal.getsignal(signum)
        if previous is None:  # a handler set outside Python: it cannot be chained, so leave it alone
            log.warning(
                "ddpwatch: %s has a handler installed outside Python; ddpwatch leaves it alone",
                signal.Signals(signum).name,
            )
            return
        if previous is signal.SIG_IGN and signum == signal.SIGTERM:
            return  # the program chose to ignore SIGTERM; there is nothing to finish before it ends
        signal.signal(signum, handler)
        self.previous[signum] = previous

    def stop(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child: the registry entry and the handlers are the parent's
        unregister(self.registry_path)
        self.registry_path = None
        if _is_main_thread():
            for signum, previous in list(self.previous.items()):
                if signal.getsignal(signum) in (self._on_usr1, self._on_term):
                    signal.signal(signum, previous)  # only ours: a handler set after ours stays
                self.previous.pop(signum)
        self._stop_wakeup_thread()

    def reset_in_child(self) -> None:
        """After fork (a DataLoader worker): this process is no rank; give back what the parent installed."""
        self.registry_path = None
        try:
            for signum, previous in self.previous.items():
                signal.signal(signum, previous)
            if self._write_fd >= 0:
                signal.set_wakeup_fd(self._old_wakeup_fd)
        except Exception:
            pass
        for fd in (self._read_fd, self._write_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.previous, self._read_fd, self._write_fd, self._thread = {}, -1, -1, None

    # ----- the wakeup pipe and its reader -----
    def _start_wakeup_thread(self) -> None:
        try:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            self._old_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (OSError, ValueError) as exc:
            log.info("ddpwatch: no wakeup pipe (%s): signals act only when the main thread runs Python", exc)
            return
        self._read_fd, self._write_fd = read_fd, write_fd
        self._thread = threading.Thread(target=self._read_signals, name="ddpwatch-signals", daemon=True)
        self._thread.start()

    def _stop_wakeup_thread(self) -> None:
        if self._thread is None:
            return
        restored = _is_main_thread()
        if restored:
            current = signal.set_wakeup_fd(self._old_wakeup_fd)
            if current not in (self._write_fd, -1):
                signal.set_wakeup_fd(current)  # someone replaced ours meanwhile: theirs stays
        try:
            os.write(self._write_fd, b"\0")  # 0 is no signal: it tells the reader to stop
        except OSError:
            pass
        self._thread.join(5.0)
        if restored:  # else signals still write to the pipe: closing it would let them hit a reused fd number
            for fd in (self._read_fd, self._write_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._thread, self._read_fd, self._write_fd = None, -1, -1

    def _read_signals(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 512)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum == 0:
                    return
                if self._old_wakeup_fd >= 0:  # someone else's wakeup fd (asyncio): pass every byte on
                    try:
                        os.write(self._old_wakeup_fd, bytes([signum]))
                    except OSError:
                        pass
                try:
                    self._from_thread(signum)
                except Exception:
                    log.warning("ddpwatch: signal handling failed", exc_info=True)

    def _from_thread(self, signum: int) -> None:
        """Act for the main thread (it may sit in a collective) only while ddpwatch's handler is the installed one.

        The C-level trampoline writes every signal that has any Python handler to the wakeup pipe, so the byte
        comes just the same after the program installed its own handler (a checkpoint on SIGTERM, Lightning's,
        SIGINT's KeyboardInterrupt): that handler is the program's decision, and runs in the main thread as it
        would without ddpwatch."""
        if signum in ENDING_SIGNALS:
            self.mailbox.note_ending(signal.Signals(signum).name)  # published with this rank's exit
        if signum == signal.SIGTERM and self._ending_by_verdict():
            return  # not reached: the verdict ended this rank with ddpwatch's exit code, whatever handler is set
        if not self._handles(signum):
            return
        if signum == signal.SIGUSR1:
            self.mailbox.ask_dump()
        elif signum == signal.SIGTERM and self.previous.get(signal.SIGTERM) is signal.SIG_DFL:
            # A Python handler set before ours runs in the main thread, as it would have without ddpwatch.
            self._terminate(signum)

    def _handles(self, signum: int) -> bool:
        """Whether ddpwatch's own handler for `signum` is installed now (signal.getsignal works from any thread)."""
        handlers: dict[int, Callable] = {signal.SIGUSR1: self._on_usr1, signal.SIGTERM: self._on_term}
        ours = handlers.get(signum)
        return ours is not None and signum in self.previous and signal.getsignal(signum) == ours

    def _wakeup_is_ours(self) -> bool:
        """Whether the wakeup pipe still reaches our reader (asyncio, for one, may have set its own since)."""
        if self._thread is None:
            return False
        try:
            current = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(current, warn_on_full_buffer=current != self._write_fd)
        except ValueError:
            return False
        return current == self._write_fd

    # ----- the handlers -----
    def _on_usr1(self, signum, frame) -> None:
        if os.getpid() == self.pid and not (self._wakeup_is_ours() and self._handles(signum)):
            # else the reader thread has asked already: one signal, one report. (The reader asks only while ours
            # is installed; here a handler the program installed later is calling ours.)
            self.mailbox.ask_dump()
        previous = self.previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    def _on_term(self, signum, frame):
        previous = self.previous.get(signum, signal.SIG_DFL)
        if self._ending_by_verdict():
            return None
        if callable(previous):  # the program's own handler decides; ours only lets a report finish first
            if os.getpid() == self.pid:
                self._look_for_a_vanished_peer()
                self.finish_report()
            return previous(signum, frame)
        self._terminate(signum)
        return None

    def _ending_by_verdict(self) -> bool:
        """An action=abort verdict is out, so this rank ends with ddpwatch's exit code anyway. A launcher's SIGTERM
        (torchrun, once the first rank has exited) then ends it quietly, after the report: no framework handler
        starting its own teardown, no traceback from collectives failing on the way down."""
        code = self.mailbox.abort_code  # set by abort.AbortPolicy once armed
        if code is None or os.getpid() != self.pid:
            return False
        self.finish_report()
        try:
            sys.stderr.write(f"ddpwatch: SIGTERM after the verdict; ending with exit code {code} (action=abort)\n")
            sys.stderr.flush()
        finally:
            os._exit(code)
        return True

    def _look_for_a_vanished_peer(self) -> None:
        """The launcher may be ending this rank because a peer exited, before this rank's collective failed: the
        watchdog looks once for a peer gone and reports it (finish_report waits for it)."""
        self.mailbox.ask_look_for_a_vanished_peer()

    def finish_report(self, limit: float | None = None) -> bool:
        """Wait (at most `limit` seconds, default TERM_GRACE_S) for a report being written; True if one finished."""
        limit = TERM_GRACE_S if limit is None else limit
        if not self.mailbox.report_in_progress():
            return False
        sys.stderr.write(f"ddpwatch: SIGTERM while a report is being written; finishing it (at most {limit:.0f} s)\n")
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.mailbox.report_in_progress():
            time.sleep(0.05)
        return not self.mailbox.report_in_progress()

    def _terminate(self, signum: int) -> None:
        """End the process by `signum` with its default action, as if ddpwatch had never been there."""
        if _is_main_thread():
            self._term_taken = True  # ddpwatch's handler consumed this SIGTERM: no other handler will see it
        if not self._dying.acquire(blocking=False):
            return  # the other path (main thread or reader) is already on it
        self._look_for_a_vanished_peer()
        self.finish_report()
        if not self._term_taken and not self._handles(signum):
            # The program installed its own handler while the report was finishing; the signal, still pending
            # in the main thread, runs that handler, which decides now.
            self._dying.release()
            return
        unregister(self.registry_path)
        # The default action runs no atexit: the exit, with its signal, is published first, so the peers see a
        # stop and not a rank that vanished (crashes.vanished_incident)
        self.mailbox.ask_exit_published()  # a bounded wait: the watchdog publishes it, then ends its loop
        self._die_impl(signum)

    @staticmethod
    def _die(signum: int) -> None:
        try:
            sys.stderr.flush()
        except Exception:
            pass
        try:
            _default_disposition(signum)
            os.kill(os.getpid(), signum)
            time.sleep(5.0)  # delivery is asynchronous; this is only reached if the signal is blocked here
        finally:
            os._exit(128 + signum)
