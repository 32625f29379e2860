"""One incident, written: the ranks' stacks collected, assessed, built, the verdict said, the native stacks read, then
the report folder written once, with them."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, NamedTuple, cast

from .. import analysis
from ..config import REPORT, action_row
from ..capture.sites import is_internal_file
from ..analysis import confirm
from ..analysis.incident import build as build_incident
from ..format import documents
from ..logonce import log_once
from ..render import report, wording
from ..render.text import render_text
from ..static import rankcond
from ..terminal import say
from . import alerts, evidence, verdict
from .store import StoreUnavailable
from .throttle import AlertThrottle

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import RecordDoc

log = logging.getLogger("ddpwatch")

# How long the writer waits for every rank's answer before it writes what it has; for collectives that completed
# without matching too: the answers are what confirms the positions the store held (analysis/confirm.py), and a
# running rank answers once a round
COLLECT_S = 2.0
MAX_OUTSIDE_READS = 4  # busy local ranks whose native stacks the writer reads itself (py-spy, up to 3 s each)


def _render_or_summary(incident: dict) -> str:
    """report.txt's text, or, when rendering fails on something unforeseen, one line per finding."""
    try:
        return render_text(incident)
    except Exception:
        log.warning("ddpwatch: could not render the report; its findings follow", exc_info=True)
        lines = [
            f"ddpwatch: [{f.get('kind')}] {wording.rank_list(f.get('ranks') or [])}: {f.get('summary')}"
            for f in incident.get("findings") or ()
        ]
        return "\n".join(lines or ["ddpwatch: a hang was found, but its report could not be rendered"]) + "\n"


def _pid(value) -> int | None:
    """A process id as a peer published it (checked by the store's reader, but never trusted to be a number)."""
    try:
        return int(value) if value else None
    except (TypeError, ValueError, OverflowError):
        return None


class NativeReads:
    """One incident's native stacks (py-spy), in hand before its folder is written: those this rank reads, each on a
    thread of its own (py-spy, up to PY_SPY_TIMEOUT_S each), and the answering peers' from the store."""

    def __init__(self, job, number: int):
        self.job = job
        self.number = number
        self._read: dict = {}  # rank -> py-spy's dump; each thread writes its own rank's key
        self._threads: list = []

    def start(self, rank: int, pid: int) -> None:
        def read() -> None:
            self._read[rank] = evidence.native_stacks(pid)  # looked up per call: tests replace evidence's

        thread = threading.Thread(target=read, name=f"ddpwatch-py-spy-{rank}", daemon=True)
        self._threads.append((rank, thread))
        thread.start()

    def gather(self, answered: set) -> dict:
        """rank -> native stacks of every rank read here and of every rank in `answered` that sent its own, or what
        came within PY_SPY_TIMEOUT_S + 1 s of now."""
        deadline = time.monotonic() + evidence.PY_SPY_TIMEOUT_S + 1.0
        for _, thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        natives = {rank: self._read[rank] for rank, _ in self._threads if rank in self._read}
        from_store = answered - {rank for rank, _ in self._threads}
        while from_store - set(natives):
            natives.update(self.job.natives(self.number, from_store - set(natives)))
            if not from_store - set(natives) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return natives


class RankIdentity(NamedTuple):
    """Which rank of which run writes: what every document it writes says of it."""

    rank: int
    world_size: int
    host: str
    run_tag: str


class IncidentWriter:
    """Writes the incidents this rank leads, given what it needs: `job` (the store protocol), `answers` (this rank's
    answers: its own to its own incident), `policy` (abort.AbortPolicy, told when the verdict is out and when the
    report is written: torchrun's error file, the exit), `logged` (the watchdog's set of warnings said once) and
    `stopping` (an Event, set once the process exits: no native stacks are waited for then)."""

    def __init__(self, job, config, identity: RankIdentity, *, answers, policy, logged: set, stopping: threading.Event):
        self.job = job
        self.config = config
        self.rank, self.world_size, self.host, self.run_tag = identity
        self.answers = answers
        self.policy = policy
        self.logged = logged
        self.stopping = stopping
        self._frozen_stacks: dict = {}  # rank -> py-spy's read of it (once per peer)
        self._local_dumps: set = set()  # (group, seq) of each collective this rank dumped itself stuck in
        self.alerts = AlertThrottle()  # one on_incident run per finding kind per window, whatever starts incidents

    def read_frozen_stacks(self, silent: dict) -> None:
        """A frozen peer cannot answer: read its Python stack from outside with py-spy (once per peer) into its
        view in `silent` (peers.PeerTracker.silent_peers), before the assessment that may start an incident."""
        for rank, view in silent.items():
            if not (view.get("process") or {}).get("exists"):
                continue
            cached = self._frozen_stacks.get(rank)
            if cached is None:
                dump = evidence.native_stacks(int(view["last_state"]["pid"]), native=False)
                cached = self._frozen_stacks[rank] = dump
            if cached.get("threads"):
                view["last_state"] = dict(
                    view["last_state"], stacks=evidence.python_stack_from_py_spy(cached, is_internal_file)
                )
            else:
                view["py_spy"] = cached.get("unavailable")

    def write(self, assessment, silent: dict | None, watched: dict, action: str):
        """Collect, analyse, announce and write one incident: (folder or None, number, the action carried out: a
        report where the built incident rests on readings only), or None when it was called off. `watched` holds
        the peers' states of the look that started it: a busy peer's stands in for its answer.

        The verdict reaches stderr (and torchrun's error file) as soon as the answers are in, before any report file;
        the folder is written once, after it, and the native stacks read since go into its native.json (py-spy
        pauses each process it reads: the report files do not wait for it). Only then does an abort end the job,
        so a peer's own native stacks are still sent. A report that cannot be written
        anywhere (a full disk, a file size limit, no usable folder) loses nothing else: the verdict is posted and an
        abort still ends the job."""
        since = confirm.asked_positions(assessment.findings) if assessment.verdict == analysis.MISMATCH else {}
        number = self.job.open_incident(
            {
                "trigger": assessment.verdict,
                "leader": self.rank,
                "action": action,
                "fingerprint": assessment.fingerprint,
                **({"since": since} if since else {}),  # the positions each rank's answer is to hold (confirm.py)
            }
        )
        self.answers.own(number, since)
        contributions = self._collect(
            number,
            answering=self.world_size - len(silent or ()),
        )
        final, busy = self._with_stand_ins(contributions, silent or {}, watched)
        incident = self._build(assessment, final, contributions, silent)
        if incident is None:
            return None
        if action_row(action).ends_rank and not analysis.findings_act(incident["findings"]):
            action = REPORT  # readings only (the findings as built now): reported, never acted on
        say("\n" + _render_or_summary(incident))  # after any progress bar; before any file
        self.policy.verdict_out(incident, action)
        folder = self._write_report_folder(incident)
        if folder is not None:
            self._add_native_stacks(number, incident, busy, folder)
            self.policy.report_written(incident, action)
        alerts.announce(self.config, incident, folder, self.alerts)  # returns at once: the hook runs on a thread
        # Posted once the folder is written: with action=abort the peers exit on it.
        first = incident["findings"][0] if incident["findings"] else {}
        self.job.post_verdict(
            number,
            {
                "folder": folder,
                "kinds": [f["kind"] for f in incident["findings"]],
                "action": action,
                "culprits": first.get("ranks"),
                "summary": first.get("summary"),
                "positions": verdict.ranges_by_position(final, self.world_size, self.config.grace),
            },
        )
        return folder, number, action

    def _with_stand_ins(self, contributions: dict, silent: dict, watched: dict) -> tuple:
        """Every rank's state: its answer, else what the leader saw of it; and the local ranks too busy to answer."""
        final = dict(contributions)
        stand_ins = {
            rank: view["last_state"] for rank, view in silent.items() if rank not in final and view.get("last_state")
        }  # its last heartbeat: all there is
        stand_ins.update(
            {rank: position for rank, position in watched.items() if rank not in final and rank not in stand_ins}
        )  # too busy (a GIL-holding call) to answer
        busy = sorted(rank for rank, seen in stand_ins.items() if rank not in silent and seen.get("host") == self.host)
        # What the leader saw wins (a busy rank's cleared wait, py-spy's stack); its last whole state adds history.
        for rank, view in self.job.with_history(stand_ins).items():
            final[rank] = dict(view, stale=True)
        return final, busy

    def _build(self, assessment, final: dict, contributions: dict, silent) -> dict | None:
        """The incident from every rank's state, assessed again; None when a deadlock dissolved meanwhile."""
        again = analysis.assess(final, self.world_size, self.config.grace, self.config.timeout, silent)
        if assessment.verdict == analysis.DEADLOCK and (again.verdict, again.fingerprint) != (
            assessment.verdict,
            assessment.fingerprint,
        ):
            log.info("ddpwatch: the ranks moved on while stacks were collected; no report")
            return None
        behind = confirm.stale_and_behind(final, silent or {}, self.config.grace)
        if again.verdict == analysis.DEADLOCK and behind:
            # Their position may be one they left before their watchdog could publish again: no proof yet. The claim
            # goes back, so whoever sees the same deadlock next (with their answers) writes it.
            log.info(
                "ddpwatch: rank(s) %s did not answer and their last position is behind the others'; no report", behind
            )
            self.job.release(assessment.fingerprint)
            return None
        findings = (
            again.findings if again.verdict else ([] if assessment.verdict == analysis.DUMP else assessment.findings)
        )
        findings = self._confirmed(assessment, again.verdict, findings, final, contributions, silent or {})
        if findings is None:
            return None
        built = build_incident(
            final,
            self.world_size,
            self.config.grace,
            self.config.timeout,
            silent=silent,
            trigger=assessment.verdict,
            findings=findings,
            run_id=self._incident_id(),
            written_by=self.rank,
            created_at=time.time(),
            missing_ranks=[r for r in range(self.world_size) if r not in contributions],
            rank_conditions=rankcond.capture_rank_conditions(final),
        )
        # As report.json has it: the summary and fix of each finding. What takes it from here (render_text,
        # save_incident, alerts) takes a plain dict still, which an Incident is at run time; the type checker keeps
        # TypedDicts apart from dict (render/report.py's _plain says the same).
        return cast(dict, wording.worded_incident(built))

    def _confirmed(self, assessment, again, findings: list, final: dict, answers: dict, silent: dict):
        """The findings, their basis saying whether the ranks they describe confirmed them in their own answers
        (analysis/confirm.py); None when a completed mismatch read from the store is refuted by those answers."""
        if assessment.verdict == analysis.DUMP:
            return findings
        if assessment.verdict == analysis.MISMATCH:
            shown = analysis.completed_mismatches(answers, self.world_size)
            status, missing = confirm.completed(findings, shown.fingerprint, assessment.fingerprint, answers)
            if status == confirm.REFUTED:
                log_once(
                    self.logged,
                    "refuted",
                    "ddpwatch: collectives that completed without matching, as the store held them, were not what the "
                    "ranks answered for those positions: no report (someone else may be writing to the job's store; "
                    "said once)",
                )
                return None
            return confirm.with_confirmation(findings, missing)
        if again != assessment.verdict:  # the answers no longer show it: it rests on the positions read before
            named = sorted({r for f in findings for r in f.get("ranks") or ()}) or sorted(final)
            return confirm.with_confirmation(findings, named)
        return confirm.with_confirmation(findings, confirm.unconfirmed_blocked(final, silent, self.config.grace))

    def _add_native_stacks(self, number: int, incident: dict, busy: list, folder: str) -> None:
        """Each rank's native stacks into the incident folder's native.json, once its report files are written
        (py-spy pauses the process it reads, and on this rank that would delay the verdict, then the report): this
        rank's own and the `busy` local ranks' (too busy to answer: a C call holding the GIL, where such a rank sits
        is exactly what the report must show) read here, side by side; the others', sent by each rank that answered
        (not stale) as it answered, from the store."""
        if self.stopping.is_set() or not self.config.native_stacks:
            return  # the process exits, or the user turned them off: the folder holds the Python stacks
        try:
            natives = NativeReads(self.job, number)
            natives.start(self.rank, os.getpid())
            for state in incident["ranks"]:
                pid = _pid(state.get("pid"))
                if state["rank"] in busy[:MAX_OUTSIDE_READS] and pid:
                    natives.start(state["rank"], pid)
            read = natives.gather({state["rank"] for state in incident["ranks"] if not state.get("stale")})
            if read:
                documents.save_native_stacks(folder, incident["run_id"], read)
        except StoreUnavailable:
            raise
        except Exception:  # the verdict is out and the report written; the native stacks are evidence added after
            log_once(self.logged, "native", "ddpwatch: could not add native stacks", exc_info=True)

    def _write_report_folder(self, incident: dict) -> str | None:
        """The incident folder (under `dir`, else the private fallback); None, said in one line, when neither works."""
        try:
            folder, note = documents.save_incident(self.config.dir, incident["run_id"], incident, report.renderings)
        except Exception as exc:  # OSError (EFBIG, ENOSPC, EACCES), UnsafeFolder, or a value that cannot be encoded
            incident.pop("report_dir", None)
            say(
                f"ddpwatch: could not write the report anywhere ({type(exc).__name__}: {exc}); "
                "the verdict above is all there is\n"
            )
            return None
        say(f"ddpwatch: report written to {folder}\n" + (f"ddpwatch: {note}\n" if note else ""))
        return folder

    def _incident_id(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return f"{stamp}-{self.run_tag}" if self.run_tag else stamp

    def _collect(self, number: int, answering: int, wait: float = COLLECT_S) -> dict:
        """Every rank's answer, or what came by the deadline; `answering`: how many can answer (a silent rank,
        gone or frozen, cannot: it is not waited for)."""
        deadline = time.monotonic() + wait + self.world_size / 2000  # thousands of answers take longer
        return self.job.collect(number, deadline, answering)

    def dump_if_stuck(self, read_state) -> None:
        """The store is gone: a rank blocked past grace writes its own dump, once per collective it is stuck in.
        `read_state(full=False)`: this rank's state as the watchdog publishes it."""
        state = read_state()
        record = analysis.waiting_record(state)
        if record is None or not analysis.is_blocked(state, self.config.grace):
            return
        episode = (record["group"], record["seq"])
        if episode in self._local_dumps:
            return
        self._local_dumps.add(episode)
        full = read_state(full=True)
        full["store_lost"] = True
        self.write_local_dump(full, record)

    def write_local_dump(self, full: dict, record: RecordDoc) -> None:
        """The store is gone: this stuck rank's own dump, for `ddpwatch report` to merge later."""
        folder = os.path.join(self.config.dir, f"local-{self.job.stamp or 'run'}-{self.run_tag or 'job'}")
        path = documents.save_rank_dump(folder, full)
        written = folder if path == documents.NOWHERE else os.path.dirname(path)  # the fallback, where that was used
        say(
            f"ddpwatch: rank {self.rank} is stuck in {wording.describe_op(record)} and the store is gone; wrote "
            f"{path}. Merge the ranks' dumps with: ddpwatch report {written}\n"
        )
