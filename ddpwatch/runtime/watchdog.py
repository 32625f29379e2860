"""One daemon thread per rank: publishes this rank's state, watches its peers, and turns a hang into a report."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time

from .. import analysis, atomic, private, snapshot as S
from ..analysis import rankcond
from ..analysis.incident import build as build_incident
from ..config import torchelastic_error_file
from ..logonce import log_once
from ..render import report
from . import evidence, frameworks, verdict
from .record import is_internal_file, python_stacks, user_frame
from .store import JobProtocol, StoreUnavailable

log = logging.getLogger("ddpwatch")

FAST_S = 0.1  # between two looks for an incident while this rank is blocked (training waits: the GIL is free)
MIN_PAUSE_S = 0.01  # the shortest sleep between two looks: a clock that jumps cannot make the thread spin
ANSWER_FAST_S = 10.0  # how long after blocking a rank looks for incidents every FAST_S (bounded: store load)
COLLECT_S = 2.0  # how long the writer waits for every rank's stacks before it writes what it has
MAX_OUTSIDE_READS = 4  # busy local ranks whose native stacks the writer reads itself (py-spy, up to 3 s each)
FAILURE_REPORT_S = 5.0  # how long a failed collective waits for the report before the user's error goes on
# What a collective's error says when the rank at the other end is gone (gloo, NCCL).
NOWHERE = "(nowhere: no writable directory)"
PEER_FAILURE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "remote worker", "Broken pipe",
                        "Socket Timeout", "NCCL communicator was aborted")


def _write_rank_dump(folder: str, doc: dict) -> str:
    """rank-<r>.json in `folder`, written whole or not at all (temp file + rename), with the umask's mode; else in
    this user's private temp folder; a failed write (full disk) leaves no temp file behind."""
    data = (S.dumps(doc) + "\n").encode("utf-8")
    name, sub = f"rank-{doc['rank']}.json", os.path.basename(folder)
    places = ((folder, lambda: private.open_subfolder(folder)),
              (os.path.join(report.fallback_dir(), sub), lambda: report.open_fallback(sub)))
    for base, open_base in places:
        try:
            fd = open_base()
        except OSError:
            continue
        try:
            atomic.write_file(fd, name, data, temp=f".rank-{doc['rank']}-{os.getpid()}-{threading.get_ident()}.tmp")
            return os.path.join(base, name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return NOWHERE


def _say(text: str) -> None:
    """Write to stderr whatever it is and whatever stderr is: the verdict must get out even when nothing else can.

    Lines here quote peers, the store and paths: control characters are shown, never acted on by the terminal."""
    text = report.render.visible(text, keep_newlines=True)
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
        return
    except Exception:
        pass
    try:  # a closed, replaced or strictly encoding sys.stderr: the bytes, straight to file descriptor 2
        os.write(2, text.encode("utf-8", "backslashreplace"))
    except Exception:
        pass


def _render_or_summary(incident: dict) -> str:
    """report.txt's text, or, when rendering fails on something unforeseen, one line per finding."""
    try:
        return report.render.render_text(incident)
    except Exception:
        log.warning("ddpwatch: could not render the report; its findings follow", exc_info=True)
        lines = [f"ddpwatch: [{f.get('kind')}] {analysis.rank_list(f.get('ranks') or [])}: {f.get('summary')}"
                 for f in incident.get("findings") or ()]
        return "\n".join(lines or ["ddpwatch: a hang was found, but its report could not be rendered"]) + "\n"


def _end_process(code: int) -> None:
    try:
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(code)


class Watchdog(threading.Thread):
    """Never raises into, slows, or hangs training: every failure is logged once and the watchdog steps aside."""

    def __init__(self, recorder, config, rank: int, world_size: int, store, run_tag: str):
        super().__init__(name="ddpwatch-watchdog", daemon=True)
        self.recorder = recorder
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.job = JobProtocol(store, world_size)  # every key and round trip on the store lives there
        self.run_tag = run_tag
        self.host = socket.gethostname()
        self.beat = 0
        self.registered_waiting = False
        self.answered = 0
        self.reported: set = set()
        self.pending_abort = None  # an action=abort incident this rank (itself configured abort) waits on
        self.abort_code = 0  # set once an action=abort verdict is out: from then on a failing collective ends the rank
        self.peer_beats: dict = {}
        self._stop_event = threading.Event()
        self._dump_requested = threading.Event()
        self.writing = threading.Event()  # set while a report is being written: SIGTERM waits for it (control.py)
        self._peer_failure = threading.Event()
        self._failure_handled = threading.Event()
        self._local_dumps: set = set()
        self._logged: set = set()
        self._store_ok = True
        self.sampler = evidence.ProcessSampler()
        self._frozen_stacks: dict = {}
        self._explained: tuple = (None, (None, None))  # (the wait it was read for, (framework context, condition))
        self._watched_states: dict = {}  # the peers' states of the last look that started an incident
        self._unseen: tuple = (None, None, 0.0)  # (progress, Flight-Recorder-only record found, idle of next read)
        self._peer_looks: dict = {}  # rank -> (pid, psutil facts, monotonic time) of the last look while silent
        self._blocked_since = 0.0  # monotonic time this rank registered as waiting
        self._last_to_block = False  # this round's registration made every rank waiting

    # ----- lifecycle -----
    def stop(self, timeout: float = 5.0) -> None:
        if not self.abort_code:  # after an abort verdict the hook stays: a failing collective still ends the rank
            self.recorder.failure_hook = None
        self._failure_handled.set()  # a training thread waiting on a failure report must not wait on a stopped watchdog
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        self._publish_exit()

    def start(self) -> None:
        """Publish a first state before training goes on, so a rank that dies at once is still known (pid, host)."""
        try:
            self.job.publish(self.rank, self.state())
        except Exception:
            pass  # the thread will find out, and log, on its first round
        self.recorder.failure_hook = self.on_collective_failure
        super().start()

    def run(self) -> None:
        """A full round every `interval`; between rounds a look, costing a few attribute reads, at the first moment
        this rank can have been blocked for `grace`, so that a rank that has just blocked publishes at once (the last
        rank to block proves a deadlock without waiting for anyone's round); and, while blocked, a look every FAST_S
        for an incident to answer (it slows nothing: training is waiting)."""
        due = time.monotonic() + self.config.interval
        while not self._stop_event.wait(self._pause(time.monotonic(), due)):
            now = time.monotonic()
            try:
                if not self._store_ok:
                    if now >= due:
                        due = now + self.config.interval
                        self.tick_local()
                elif now >= due or self._round_wanted_now(now):
                    due = now + self.config.interval
                    self.tick()
                elif self.registered_waiting and now - self._blocked_since < ANSWER_FAST_S:
                    self._answer_incidents()
                    if self.pending_abort is not None:
                        self._check_abort()
            except StoreUnavailable as exc:
                self._store_ok = False
                self._log_once("store", "ddpwatch: the store stopped answering (%s); no longer publishing; "
                                        "each rank now writes its own dump when it is stuck", exc)
            except Exception:
                self._log_once("tick", "ddpwatch: watchdog error, continuing", exc_info=True)
            finally:
                if self._peer_failure.is_set() and not self._store_ok:
                    self._failure_done()

    def _pause(self, now: float, due: float) -> float:
        """Seconds to sleep before the next look: sleep, do not poll, while nothing can have blocked yet."""
        if self.registered_waiting and now - self._blocked_since < ANSWER_FAST_S:
            return FAST_S
        if not self._store_ok or self.registered_waiting:
            return max(0.0, due - now)
        # A collective in flight since the last progress is blocked at progress + grace at the earliest; with none
        # in flight, one started now would be at now + grace.
        blocked_at = (self.recorder.progress_mono if self.recorder.inflight else now) + self.config.grace
        return max(MIN_PAUSE_S, min(due, blocked_at) - now)

    def _round_wanted_now(self, now: float) -> bool:
        """Whether something cannot wait for the next round: a dump asked for, a peer's failure, or this rank
        blocked for `grace` and not yet registered as waiting (one dict and one float read: no store, no lock)."""
        if self._dump_requested.is_set() or self._peer_failure.is_set():
            return True
        return (not self.registered_waiting and bool(self.recorder.inflight)
                and now - self.recorder.progress_mono >= self.config.grace)

    # ----- a peer's failure seen by the training thread (gloo: "Connection closed by peer") -----
    def on_collective_failure(self, error: BaseException) -> None:
        """Called by the recorder when a collective fails: end the rank if an abort verdict is out, else give the
        watchdog a moment to report a vanished peer.

        The training thread waits (bounded) and then re-raises the user's exception unchanged.
        """
        peer_gone = any(marker in str(error) for marker in PEER_FAILURE_MARKERS)
        if self.abort_code or (self.pending_abort is not None and peer_gone):
            # The verdict is out and peers are exiting: end here, not in their error; but first let the report being
            # finished (the native-stacks pass rewrites its folder) end, or a staging folder is left behind.
            if threading.current_thread() is not self:
                deadline = time.monotonic() + evidence.PY_SPY_TIMEOUT_S + 2.0
                while self.writing.is_set() and time.monotonic() < deadline:
                    time.sleep(0.05)
            _end_process(self.abort_code or self.config.exit_code)
        if threading.current_thread() is self or not self.is_alive() or not peer_gone:
            return
        self._failure_handled.clear()
        self._peer_failure.set()
        self._failure_handled.wait(FAILURE_REPORT_S + self.config.interval)

    def _failure_done(self) -> None:
        self._peer_failure.clear()
        self._failure_handled.set()

    def _report_peer_failure(self) -> None:
        """Find the rank that vanished (psutil on this host; a heartbeat that stops elsewhere) and report it."""
        deadline = time.monotonic() + FAILURE_REPORT_S - 1.0
        silent: dict = {}
        while time.monotonic() < deadline:
            states = self.job.states()
            silent = self._vanished_peers(states)
            if silent:
                break
            time.sleep(self.config.interval)
        if not silent:
            return
        findings = analysis.stage_findings(analysis.STAGE_SILENT, silent, {}, self.config.grace)
        fingerprint = "peer-failure-" + "-".join(str(r) for r in sorted(silent))
        if fingerprint in self.reported or not self.job.claim(fingerprint):
            return
        self.reported.add(fingerprint)
        self.run_incident(analysis.Assessment(analysis.SILENT, findings, fingerprint), silent,
                          action="report")  # the user's exception follows; torchrun decides what to do

    def _vanished_peers(self, states: dict) -> dict:
        silent = {}
        for rank in range(self.world_size):
            last = states.get(rank)
            if rank == self.rank or not last or last.get("status") == S.EXITED:
                continue
            quiet = self._silent_for(rank, last)
            process = evidence.peer_process_facts(int(last.get("pid", 0))) if last.get("host") == self.host else None
            gone = (process or {}).get("exists") is False
            if gone or (process is None and quiet >= 3 * self.config.interval):
                silent[rank] = {"silent_s": round(quiet, 1), "last_state": last, "process": process,
                                "remote": process is None}
        return silent

    # ----- without the store: each rank dumps itself -----
    def tick_local(self) -> None:
        """The store is gone: no peers to compare with, so a rank that is stuck writes its own dump for later."""
        self.recorder.poll_pending()
        state = self.state()
        record = analysis.waiting_record(state)
        if record is None or not analysis.is_blocked(state, self.config.grace):
            return
        episode = (record["group"], record["seq"])
        if episode in self._local_dumps:
            return
        self._local_dumps.add(episode)
        full = self.state(full=True)
        full["store_lost"] = True
        folder = os.path.join(self.config.dir, f"local-{self.job.stamp or 'run'}-{self.run_tag or 'job'}")
        path = _write_rank_dump(folder, full)
        written = folder if path == NOWHERE else os.path.dirname(path)  # the fallback, where that was used
        _say(f"ddpwatch: rank {self.rank} is stuck in {analysis.describe_op(record)} and the store is gone; wrote "
             f"{path}. Merge the ranks' dumps with: ddpwatch report {written}\n")

    def request_dump(self) -> None:
        """Ask for a report now, from every rank, without stopping the job (SIGUSR1, `ddpwatch dump`).

        Safe from a signal handler: it only sets an event; the watchdog thread does the work on its next round.
        """
        self._dump_requested.set()

    def _log_once(self, key: str, message: str, *args, **kwargs) -> None:
        log_once(self._logged, key, message, *args, **kwargs)

    # ----- one round -----
    def tick(self) -> None:
        self.recorder.poll_pending()
        state = self.state()
        self.job.publish(self.rank, state)
        self._update_waiting(state)
        self._answer_incidents()
        if self.pending_abort is not None:
            self._check_abort()
        if self._peer_failure.is_set():
            try:
                self._report_peer_failure()
            finally:
                self._failure_done()
        if self._dump_requested.is_set():
            self._dump_requested.clear()
            self.run_incident(analysis.Assessment(analysis.DUMP, [], f"dump-{self.rank}-{time.time():.3f}"))
        elif self._should_watch(state) or self._last_to_block:
            self.watch()

    def state(self, full: bool = False) -> dict:
        self.beat += 1
        doc = {"format_version": S.FORMAT_VERSION, "rank": self.rank, "world_size": self.world_size,
               "pid": os.getpid(), "host": self.host, "beat": self.beat, "published_at": time.time(),
               "status": S.RUNNING}
        doc.update(self.recorder.snapshot(recent=32 if full else 8))
        self._add_unseen_collective(doc)
        if full:
            doc["stacks"] = python_stacks(skip_thread=threading.get_ident())
            doc["process"] = self.sampler.facts()
            doc["progress_bars"] = evidence.progress_bars()
            doc["flight_recorder"] = evidence.flight_recorder_tail()
            evidence.align_flight_recorder(doc)
        self._explain_wait(doc, full)
        return doc

    def _explain_wait(self, doc: dict, full: bool) -> None:
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
        main = sys._current_frames().get(threading.main_thread().ident)
        context = None
        try:
            context = frameworks.framework_context(main)
        except Exception:
            self._log_once("framework", "ddpwatch: could not read the framework's state", exc_info=True)
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

    def _add_unseen_collective(self, doc: dict) -> None:
        """No recorded collective in flight, no progress, and the training thread sits inside torch: ask the
        Flight Recorder whether c10d has an op in flight that Python never saw (compiled graphs, torch.ops, C++).

        A read costs up to ~30 ms at 2,000 entries (benchmarks.flight_recorder) and holds the GIL: one read per
        doubling of the idle time (grace, 2 grace, 4 grace...), and a found op is kept, not read again.
        """
        idle = doc.get("idle_s", 0.0)
        if doc["inflight"] or idle < self.config.grace:
            return
        progress, found, next_read = self._unseen
        if progress != doc["progress"]:
            found, next_read = None, self.config.grace
        if found is None and idle >= next_read:
            found = self._read_unseen_collective(doc)
            next_read = min(2 * idle, idle + 30.0)
        self._unseen = (doc["progress"], found, next_read)
        if found is not None:
            record = dict(found, age_s=round(max(0.0, time.time() - found["start"]), 4))
            if record["age_s"] >= self.config.grace:
                doc["inflight"] = [record]

    def _read_unseen_collective(self, doc: dict) -> dict | None:
        main = sys._current_frames().get(threading.main_thread().ident)
        if main is None or not is_internal_file(main.f_code.co_filename):
            return None  # running the user's own Python: busy, not blocked in a native wait
        entries = evidence.flight_recorder_active()
        if not entries:
            return None
        return evidence.record_from_flight_recorder(entries[0], doc, user_frame(main), time.time())

    def _publish_exit(self) -> None:
        if not self._store_ok:
            return
        try:
            doc = self.state()
            doc["status"] = S.EXITED
            self.job.publish(self.rank, doc)
            if self.registered_waiting:
                self.job.change_waiting(-1)
                self.registered_waiting = False
        except Exception:
            pass  # the store may already be gone at shutdown; nothing to save

    def _update_waiting(self, state: dict) -> None:
        """Register this rank as waiting (or no longer); the rank whose registration completes the count is the last
        to block: it looks for a deadlock itself, at once, instead of leaving it to the leader's next round."""
        blocked = analysis.is_blocked(state, self.config.grace)
        self._last_to_block = False
        if blocked != self.registered_waiting:
            waiting = self.job.change_waiting(1 if blocked else -1)
            self.registered_waiting = blocked
            if blocked:
                self._blocked_since = time.monotonic()
                self._last_to_block = waiting >= self.world_size > 1

    # ----- who watches: rank 0, or the lowest rank whose peers below it have gone silent -----
    def _should_watch(self, state: dict) -> bool:
        if self.world_size < 2:
            return False
        if self.rank == 0:
            self.job.beat_leader()  # 8 bytes the waiting ranks can read cheaply
            return self.job.waiting() > 0
        if not self.registered_waiting:
            return False
        # Normally rank 0 watches: read its heartbeat counter only, the others' states only once it has gone silent.
        leader_beat = {"beat": self.job.leader_beat()}
        if self._silent_for("leader", leader_beat) < self.config.dead_after:
            return False
        lower = self.job.positions(range(1, self.rank))
        return all(self._silent_for(r, lower.get(r)) >= self.config.dead_after
                   for r in range(1, self.rank))

    def _silent_for(self, rank, doc: dict | None) -> float:
        """Seconds (on this rank's clock) since `rank`'s heartbeat last moved; clocks across hosts never compared."""
        now = time.monotonic()
        beat = doc.get("beat") if doc else None
        if doc and doc.get("status") == S.EXITED:
            return 0.0
        last = self.peer_beats.get(rank)
        if last is None or last[0] != beat:
            self.peer_beats[rank] = (beat, now)
            return 0.0
        return now - last[1]

    def watch(self) -> None:
        states = self.job.positions()  # enough for a verdict; the full states come with the incident's answers
        silent = self._silent_peers(states)
        self._watched_states = states  # a busy peer cannot contribute to an incident: its last state stands in
        assessment = analysis.assess(states, self.world_size, self.config.grace, self.config.timeout, silent)
        if assessment.verdict is None or assessment.fingerprint in self.reported:
            return
        self.reported.add(assessment.fingerprint)
        if not self.job.claim(assessment.fingerprint):
            return  # another rank is already writing this one
        self.run_incident(assessment, silent)

    def _silent_peers(self, states: dict) -> dict:
        """Peers whose heartbeat has not moved for dead_after seconds (or never came) and that may be judged now.

        A silent heartbeat alone proves nothing: one long C call that holds the GIL (computing, or asleep in the
        kernel) silences the watchdog thread of a healthy rank. So before `timeout` only a peer that psutil sees
        gone, stopped, traced or dead is reported; any other silent peer, and one on another host or that psutil
        cannot look at, counts as busy: it is left out of the answer and its stale state in `states` is replaced by
        a busy one (see _busy_state), so only the straggler timeout can report on it, like any busy rank.
        """
        silent = {}
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            quiet = self._silent_for(rank, states.get(rank))
            if quiet < self.config.dead_after:
                self._peer_looks.pop(rank, None)  # CPU use is measured within one silence, from its first look
                continue
            last = states.get(rank)
            view = {"silent_s": round(quiet, 1), "last_state": last}
            if last is None:
                view["never_published"] = True
            elif last.get("host") == self.host:
                view["process"] = self._look_at_peer(rank, int(last.get("pid", 0)))
                condition = (view["process"] or {}).get("condition")
                if condition in (evidence.BUSY, evidence.WAITING) or (
                        condition not in (evidence.GONE, evidence.FROZEN) and quiet < self.config.timeout):
                    states[rank] = self._busy_state(last)  # at most a straggler, reported by the timeout stage
                    continue
                if (view["process"] or {}).get("exists"):
                    self._read_frozen_stack(rank, view)
            elif quiet < self.config.timeout:
                states[rank] = self._busy_state(last)  # another host: psutil cannot tell busy from frozen there
                continue
            else:
                view["remote"] = True  # silent past the timeout: reported, saying busy and dead look the same
            silent[rank] = view
        return silent

    def _look_at_peer(self, rank: int, pid: int) -> dict | None:
        """psutil's facts about a silent local peer, judged busy or frozen against the previous look at it."""
        facts = evidence.peer_process_facts(pid)
        now = time.monotonic()
        previous = self._peer_looks.get(rank)
        self._peer_looks[rank] = (pid, facts, now)
        if facts is None:
            return None
        before, seconds = (previous[1], now - previous[2]) if previous and previous[0] == pid else (None, 0.0)
        judged = evidence.peer_condition(facts, before, seconds)
        return dict(facts, condition=judged["condition"], why=judged["why"], cpu_share=judged["cpu_share"])

    @staticmethod
    def _busy_state(last: dict) -> dict:
        """A busy peer's last published state, without its in-flight records: those may be from before it went
        busy (the barrier it just left), and a stale wait must never count as blocked or prove a deadlock."""
        return dict(last, inflight=[])

    def _read_frozen_stack(self, rank: int, view: dict) -> None:
        """A frozen peer cannot answer: read its Python stack from outside with py-spy (once per peer)."""
        cached = self._frozen_stacks.get(rank)
        if cached is None:
            dump = evidence.native_stacks(int(view["last_state"]["pid"]), native=False)
            cached = self._frozen_stacks[rank] = dump
        if cached.get("threads"):
            view["last_state"] = dict(view["last_state"],
                                      stacks=evidence.python_stack_from_py_spy(cached, is_internal_file))
        else:
            view["py_spy"] = cached.get("unavailable")

    # ----- incidents -----
    def run_incident(self, assessment, silent: dict | None = None, action: str | None = None) -> None:
        self.writing.set()
        try:
            written = self._write_incident(assessment, silent, action)
        finally:
            self.writing.clear()
        if written is not None:
            folder, number, action = written
            if action == "abort":
                self._abort(folder, number, leader=True)

    def _write_incident(self, assessment, silent, action):
        """Collect, analyse, announce and write one incident: (folder or None, number, action), or None when it was
        called off.

        The verdict reaches stderr (and torchrun's error file) before any report file is written, and a report that
        cannot be written anywhere (a full disk, a file size limit, no usable folder) loses nothing else: the verdict
        is posted and an abort still ends the job."""
        action = action or ("report" if assessment.verdict == analysis.DUMP else self.config.action)
        number = self.job.open_incident({"trigger": assessment.verdict, "leader": self.rank, "action": action,
                                         "fingerprint": assessment.fingerprint})
        self._contribute(number)
        contributions = self._collect(number)
        final = dict(contributions)
        stand_ins = {rank: view["last_state"] for rank, view in (silent or {}).items()
                     if rank not in final and view.get("last_state")}  # its last heartbeat: all there is
        stand_ins.update({rank: position for rank, position in self._watched_states.items()
                          if rank not in final and rank not in stand_ins})  # too busy (a GIL-holding call) to answer
        heartbeats = self.job.states(sorted(stand_ins)) if stand_ins else {}
        busy = sorted(rank for rank, seen in stand_ins.items()
                      if rank not in (silent or {}) and seen.get("host") == self.host)
        for rank, seen in stand_ins.items():
            # What the leader saw wins (a busy rank's cleared wait, py-spy's stack); its last heartbeat adds the history.
            final[rank] = {**(heartbeats.get(rank) or {}), **seen, "stale": True}
        again = analysis.assess(final, self.world_size, self.config.grace, self.config.timeout, silent)
        if assessment.verdict == analysis.DEADLOCK and (again.verdict, again.fingerprint) != (
                assessment.verdict, assessment.fingerprint):
            log.info("ddpwatch: the ranks moved on while stacks were collected; no report")
            return None
        findings = again.findings if again.verdict else ([] if assessment.verdict == analysis.DUMP
                                                          else assessment.findings)
        incident = build_incident(final, self.world_size, self.config.grace, self.config.timeout, silent=silent,
                                  trigger=assessment.verdict, findings=findings, run_id=self._incident_id(),
                                  written_by=self.rank, created_at=time.time(),
                                  missing_ranks=[r for r in range(self.world_size) if r not in contributions])
        _say("\n" + _render_or_summary(incident))  # after any progress bar; before any file
        if action == "abort":
            # torchrun's summary names the first rank to exit: its error file must hold the verdict before any
            # rank can exit, and only then may a collective failing here end this rank
            self._write_error_file(incident)
            self.abort_code = self.config.exit_code
        folder = self._write_report_folder(incident)
        if folder is not None:
            if action == "abort":
                self._write_error_file(incident)  # now with the report's folder
            try:
                self._add_native_stacks(number, folder, incident, busy)
            except StoreUnavailable:
                raise
            except Exception:  # the report is out; a failure adding native stacks must not stop what follows
                self._log_once("native", "ddpwatch: could not add native stacks", exc_info=True)
        # The verdict is posted once the folder is final: with action=abort the peers exit on it, and a peer gone
        # while the folder is rewritten with native stacks would end this rank mid-rewrite.
        first = incident["findings"][0] if incident["findings"] else {}
        self.job.post_verdict(number, {"folder": folder, "kinds": [f["kind"] for f in incident["findings"]],
                                       "action": action, "culprits": first.get("ranks"),
                                       "summary": first.get("summary"),
                                       "positions": verdict.positions(final, self.world_size, self.config.grace)})
        return folder, number, action

    def _write_report_folder(self, incident: dict) -> str | None:
        """The incident folder (under `dir`, else the private fallback); None, said in one line, when neither works."""
        try:
            folder, note = report.write_incident(self.config.dir, incident["run_id"], incident)
        except Exception as exc:  # OSError (EFBIG, ENOSPC, EACCES), UnsafeFolder, or a value that cannot be encoded
            incident.pop("report_dir", None)
            _say(f"ddpwatch: could not write the report anywhere ({type(exc).__name__}: {exc}); "
                 "the verdict above is all there is\n")
            return None
        _say(f"ddpwatch: report written to {folder}\n" + (f"ddpwatch: {note}\n" if note else ""))
        return folder

    def _add_native_stacks(self, number: int, folder: str, incident: dict, busy: list) -> None:
        """Second pass, after the report is out: py-spy's native stacks from every rank, files rewritten in place.

        A rank that answers reads its own; for `busy` local ranks, too busy to answer (a C call holding the GIL),
        this rank reads them from outside: where such a rank sits is exactly what the report must show."""
        self._contribute_native(number)
        natives: dict = {state["rank"]: evidence.native_stacks(int(state["pid"])) for state in incident["ranks"]
                         if state["rank"] in busy[:MAX_OUTSIDE_READS] and state.get("pid")}
        deadline = time.monotonic() + evidence.PY_SPY_TIMEOUT_S + 1.0
        wanted = {state["rank"] for state in incident["ranks"] if not state.get("stale")} | set(natives)
        while time.monotonic() < deadline and len(natives) < len(wanted):
            natives.update(self.job.natives(number, wanted - set(natives)))
            if len(natives) < len(wanted):
                time.sleep(0.1)
        if not natives:
            return
        for state in incident["ranks"]:
            if state["rank"] in natives:
                state["native"] = natives[state["rank"]]
        try:
            report.refresh_incident(folder, incident)
        except OSError as exc:
            self._log_once("refresh", "ddpwatch: could not add native stacks to %s: %s", folder, exc)

    def _incident_id(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return f"{stamp}-{self.run_tag}" if self.run_tag else stamp

    def _collect(self, number: int) -> dict:
        deadline = time.monotonic() + COLLECT_S + self.world_size / 2000  # thousands of answers take longer
        return self.job.collect(number, deadline)

    def _answer_incidents(self) -> None:
        """Answer the newest incident only: anyone who reaches the store can raise the counter, and a rank must not
        spend its time answering a thousand of them (an older one still open is closed by its writer's deadline)."""
        latest = self.job.latest_incident()
        if latest <= self.answered:
            return
        self._contribute(latest)
        info = self.job.incident_info(latest)
        if info.get("leader") == self.rank:
            return
        if info.get("action") == "abort" and self.config.action == "abort":
            self.pending_abort = latest  # this rank's own configuration decides; a peer's info cannot upgrade it
        self._contribute_native(latest)

    def _contribute(self, number: int) -> None:
        """This rank's full state and Python stacks for incident `number` (fast: no subprocess)."""
        if number <= self.answered:
            return
        self.answered = number
        self.job.contribute(number, self.rank, self.state(full=True))

    def _contribute_native(self, number: int) -> None:
        """py-spy's native stacks of this process, bounded in time; a refusal is recorded as one line of why."""
        self.job.contribute_native(number, self.rank, evidence.native_stacks(os.getpid()))

    def _check_abort(self) -> None:
        """Act on the pending incident's verdict once it is posted, and only if it agrees with this rank's own view."""
        posted = self.job.verdict(self.pending_abort)
        if posted is None:
            return
        number, self.pending_abort = self.pending_abort, None
        if not isinstance(posted, dict):
            return
        why = verdict.why_not_act(posted, self.config.action, self.state(), self.rank, self.config.grace,
                                  self.config.timeout)
        if why is not None:
            self._log_once(f"verdict-{number}", "ddpwatch: rank %d does not act on incident %d's abort verdict: %s",
                           self.rank, number, report.render.visible(why))
            return
        kinds = posted.get("kinds") if isinstance(posted.get("kinds"), list) else None
        culprits = posted.get("culprits") if isinstance(posted.get("culprits"), list) else None
        findings = [{"kind": str((kinds or ["hang"])[0]), "ranks": [r for r in culprits or () if type(r) is int],
                     "summary": posted.get("summary") if isinstance(posted.get("summary"), str) else None}]
        folder = posted.get("folder") if isinstance(posted.get("folder"), str) else None
        self._write_error_file({"findings": findings, "report_dir": folder})
        self._abort(folder, number, leader=False)

    def _write_error_file(self, incident: dict) -> None:
        """torchrun's agent prints a worker's error file in its failure summary: put the verdict there."""
        path = torchelastic_error_file()
        if not path:
            return
        findings = incident.get("findings") or []
        first = findings[0] if findings else {}
        message = (f"ddpwatch: {first.get('kind', 'hang')}"
                   + (f" (culprit {analysis.rank_list(first['ranks'])})" if first.get("ranks") else "")
                   + (f": {first['summary']}" if first.get("summary") else "")
                   + f" Report: {incident.get('report_dir') or '(being written, or none could be written)'}")
        message = report.render.visible(message)  # torchrun prints it: a peer's words must not drive the terminal
        doc = {"message": {"message": message,
                           "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))}}}
        try:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(doc, handle)  # ASCII-escaped: no string, however odd, can fail the write
        except Exception as exc:
            self._log_once("error-file", "ddpwatch: could not write the error file %s: %s", path, exc)

    def _abort(self, folder, number: int, leader: bool) -> None:
        """End this rank. Peers acknowledge first, so the writer (who may host the store) leaves last."""
        self.abort_code = self.config.exit_code
        try:
            if leader:
                deadline = time.monotonic() + 4 * self.config.interval + 1.0
                while time.monotonic() < deadline and self.job.acks(number) < self.world_size - 1:
                    time.sleep(0.05)
            else:
                self.job.ack(number)
        except StoreUnavailable:
            pass
        _say(f"ddpwatch: rank {self.rank} ending with exit code {self.config.exit_code} (action=abort); "
             f"report: {folder or '(none could be written)'}\n")
        os._exit(self.config.exit_code)
