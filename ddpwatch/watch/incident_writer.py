"""One incident, written: the ranks' stacks collected, assessed, built, the verdict said, the report folder written."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from .. import analysis, atomic, private
from ..analysis.incident import build as build_incident
from ..config import torchelastic_error_file
from ..format import documents
from ..render import report, wording
from ..render.text import render_text
from ..static import rankcond
from ..terminal import say, visible
from . import alerts, evidence, verdict
from ..capture.record import is_internal_file
from .store import StoreUnavailable

log = logging.getLogger("ddpwatch")

COLLECT_S = 2.0  # how long the writer waits for every rank's stacks before it writes what it has
# ... for collectives that completed without matching: the ranks run on, their stacks say little, and the verdict
# is due within 2 s of the position; a rank that has not answered by then stands in with its positions
MISMATCH_COLLECT_S = 0.3
MAX_OUTSIDE_READS = 4  # busy local ranks whose native stacks the writer reads itself (py-spy, up to 3 s each)
NOWHERE = "(nowhere: no writable directory)"


def _write_rank_dump(folder: str, doc: dict) -> str:
    """rank-<r>.json in `folder`, written whole or not at all (temp file + rename), with the umask's mode; else in
    this user's private temp folder; a failed write (full disk) leaves no temp file behind."""
    data = documents.rank_file_bytes(doc)
    name, sub = documents.rank_file_name(doc["rank"]), os.path.basename(folder)
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




def _render_or_summary(incident: dict) -> str:
    """report.txt's text, or, when rendering fails on something unforeseen, one line per finding."""
    try:
        return render_text(incident)
    except Exception:
        log.warning("ddpwatch: could not render the report; its findings follow", exc_info=True)
        lines = [f"ddpwatch: [{f.get('kind')}] {wording.rank_list(f.get('ranks') or [])}: {f.get('summary')}"
                 for f in incident.get("findings") or ()]
        return "\n".join(lines or ["ddpwatch: a hang was found, but its report could not be rendered"]) + "\n"


def write_error_file(incident: dict, log_once) -> None:
    """torchrun's agent prints a worker's error file in its failure summary: put the verdict there."""
    path = torchelastic_error_file()
    if not path:
        return
    findings = incident.get("findings") or []
    first = findings[0] if findings else {}
    message = (f"ddpwatch: {first.get('kind', 'hang')}"
               + (f" (culprit {wording.rank_list(first['ranks'])})" if first.get("ranks") else "")
               + (f": {first['summary']}" if first.get("summary") else "")
               + f" Report: {incident.get('report_dir') or '(being written, or none could be written)'}")
    message = visible(message)  # torchrun prints it: a peer's words must not drive the terminal
    doc = {"message": {"message": message,
                       "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(doc, handle)  # ASCII-escaped: no string, however odd, can fail the write
    except Exception as exc:
        log_once("error-file", "ddpwatch: could not write the error file %s: %s", path, exc)


class IncidentWriter:
    """Writes the incidents this rank leads. `contribute(number)` / `contribute_native(number)` add this rank's own
    answer (the watchdog's, which also answers other ranks' incidents); `policy` is told when the verdict is out
    and when the report is written (abort.AbortPolicy: torchrun's error file, the exit)."""

    def __init__(self, job, config, rank: int, world_size: int, host: str, run_tag: str, *, contribute,
                 contribute_native, policy, log_once, stopping=lambda: False):
        self.job = job
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.host = host
        self.run_tag = run_tag
        self.contribute = contribute
        self.contribute_native = contribute_native
        self.policy = policy
        self.log_once = log_once
        self.stopping = stopping  # true once the process exits: no second pass for native stacks then
        self._frozen_stacks: dict = {}  # rank -> py-spy's read of it (once per peer)

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
                view["last_state"] = dict(view["last_state"],
                                          stacks=evidence.python_stack_from_py_spy(cached, is_internal_file))
            else:
                view["py_spy"] = cached.get("unavailable")

    def write(self, assessment, silent: dict | None, watched: dict, action: str):
        """Collect, analyse, announce and write one incident: (folder or None, number), or None when it was called
        off. `watched` holds the peers' states of the look that started it: a busy peer's stands in for its answer.

        The verdict reaches stderr (and torchrun's error file) before any report file is written, and a report that
        cannot be written anywhere (a full disk, a file size limit, no usable folder) loses nothing else: the verdict
        is posted and an abort still ends the job."""
        number = self.job.open_incident({"trigger": assessment.verdict, "leader": self.rank, "action": action,
                                         "fingerprint": assessment.fingerprint})
        self.contribute(number)
        contributions = self._collect(number, answering=self.world_size - len(silent or ()),
                                      wait=MISMATCH_COLLECT_S if assessment.verdict == analysis.MISMATCH else COLLECT_S)
        final, busy = self._with_stand_ins(contributions, silent or {}, watched)
        incident = self._build(assessment, final, contributions, silent)
        if incident is None:
            return None
        say("\n" + _render_or_summary(incident))  # after any progress bar; before any file
        self.policy.verdict_out(incident, action)
        folder = self._write_report_folder(incident)
        if folder is not None:
            self.policy.report_written(incident, action)
        alerts.announce(self.config, incident, folder)  # returns at once: the hook runs on a thread of its own
        if folder is not None and not self.stopping():
            try:
                self._add_native_stacks(number, folder, incident, busy)
            except StoreUnavailable:
                raise
            except Exception:  # the report is out; a failure adding native stacks must not stop what follows
                self.log_once("native", "ddpwatch: could not add native stacks", exc_info=True)
        # The verdict is posted once the folder is final: with action=abort the peers exit on it, and a peer gone
        # while the folder is rewritten with native stacks would end this rank mid-rewrite.
        first = incident["findings"][0] if incident["findings"] else {}
        self.job.post_verdict(number, {"folder": folder, "kinds": [f["kind"] for f in incident["findings"]],
                                       "action": action, "culprits": first.get("ranks"),
                                       "summary": first.get("summary"),
                                       "positions": verdict.ranges_by_position(final, self.world_size,
                                                                               self.config.grace),
                                       **verdict.mismatch_claim(first)})
        return folder, number

    def _with_stand_ins(self, contributions: dict, silent: dict, watched: dict) -> tuple:
        """Every rank's state: its answer, else what the leader saw of it; and the local ranks too busy to answer."""
        final = dict(contributions)
        stand_ins = {rank: view["last_state"] for rank, view in silent.items()
                     if rank not in final and view.get("last_state")}  # its last heartbeat: all there is
        stand_ins.update({rank: position for rank, position in watched.items()
                          if rank not in final and rank not in stand_ins})  # too busy (a GIL-holding call) to answer
        busy = sorted(rank for rank, seen in stand_ins.items()
                      if rank not in silent and seen.get("host") == self.host)
        # What the leader saw wins (a busy rank's cleared wait, py-spy's stack); its last whole state adds history.
        for rank, view in self.job.with_history(stand_ins).items():
            final[rank] = dict(view, stale=True)
        return final, busy

    def _build(self, assessment, final: dict, contributions: dict, silent) -> dict | None:
        """The incident from every rank's state, assessed again; None when a deadlock dissolved meanwhile."""
        again = analysis.assess(final, self.world_size, self.config.grace, self.config.timeout, silent)
        if assessment.verdict == analysis.DEADLOCK and (again.verdict, again.fingerprint) != (
                assessment.verdict, assessment.fingerprint):
            log.info("ddpwatch: the ranks moved on while stacks were collected; no report")
            return None
        findings = again.findings if again.verdict else ([] if assessment.verdict == analysis.DUMP
                                                          else assessment.findings)
        built = build_incident(final, self.world_size, self.config.grace, self.config.timeout, silent=silent,
                               trigger=assessment.verdict, findings=findings, run_id=self._incident_id(),
                               written_by=self.rank, created_at=time.time(),
                               missing_ranks=[r for r in range(self.world_size) if r not in contributions],
                               rank_conditions=rankcond.capture_rank_conditions(final))
        return wording.worded_incident(built)  # as report.json has it: the summary and fix of each finding

    def _write_report_folder(self, incident: dict) -> str | None:
        """The incident folder (under `dir`, else the private fallback); None, said in one line, when neither works."""
        try:
            folder, note = report.write_incident(self.config.dir, incident["run_id"], incident)
        except Exception as exc:  # OSError (EFBIG, ENOSPC, EACCES), UnsafeFolder, or a value that cannot be encoded
            incident.pop("report_dir", None)
            say(f"ddpwatch: could not write the report anywhere ({type(exc).__name__}: {exc}); "
                "the verdict above is all there is\n")
            return None
        say(f"ddpwatch: report written to {folder}\n" + (f"ddpwatch: {note}\n" if note else ""))
        return folder

    def _add_native_stacks(self, number: int, folder: str, incident: dict, busy: list) -> None:
        """Second pass, after the report is out: py-spy's native stacks from every rank, files rewritten in place.

        A rank that answers reads its own; for `busy` local ranks, too busy to answer (a C call holding the GIL),
        this rank reads them from outside: where such a rank sits is exactly what the report must show."""
        self.contribute_native(number)
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
            self.log_once("refresh", "ddpwatch: could not add native stacks to %s: %s", folder, exc)

    def _incident_id(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return f"{stamp}-{self.run_tag}" if self.run_tag else stamp

    def _collect(self, number: int, answering: int, wait: float = COLLECT_S) -> dict:
        """Every rank's answer, or what came by the deadline; `answering`: how many can answer (a silent rank,
        gone or frozen, cannot: it is not waited for)."""
        deadline = time.monotonic() + wait + self.world_size / 2000  # thousands of answers take longer
        return self.job.collect(number, deadline, answering)

    def write_local_dump(self, full: dict, record: dict) -> None:
        """The store is gone: this stuck rank's own dump, for `ddpwatch report` to merge later."""
        folder = os.path.join(self.config.dir, f"local-{self.job.stamp or 'run'}-{self.run_tag or 'job'}")
        path = _write_rank_dump(folder, full)
        written = folder if path == NOWHERE else os.path.dirname(path)  # the fallback, where that was used
        say(f"ddpwatch: rank {self.rank} is stuck in {wording.describe_op(record)} and the store is gone; wrote "
            f"{path}. Merge the ranks' dumps with: ddpwatch report {written}\n")
