"""After the verdict: the on_incident hook (a command or a callable, bounded, never raising) and a logging record."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from typing import NamedTuple

from .. import analysis
from ..config import ON_INCIDENT_TIMEOUT_S, incident_hook_environ
from ..render import wording
from ..terminal import visible
from .throttle import ALERT_EVERY_S, AlertThrottle

log = logging.getLogger("ddpwatch")

# Runs the hook in a session of its own and kills that session at the limit. A process, not this rank's thread,
# keeps the bound: with action=abort the rank exits within a second or two of starting the hook, and torchrun kills
# the rank's process group as it stops or restarts the workers; the hook must outlive the one and not the other.
SUPERVISOR = (
    "import os, signal, subprocess, sys\n"
    "hook = subprocess.Popen(sys.argv[2], shell=True, start_new_session=True, stdin=subprocess.DEVNULL)\n"
    "try:\n"
    "    sys.exit(hook.wait(float(sys.argv[1])))\n"
    "except subprocess.TimeoutExpired:\n"
    "    os.killpg(hook.pid, signal.SIGKILL)\n"
    "    hook.wait()\n"
    "    sys.exit(124)\n"
)
TIMED_OUT = 124  # the supervisor's status for a hook it killed at the limit (as coreutils' timeout says it)
WAIT_MARGIN_S = 5.0  # the supervisor's own start and end, beyond the hook's bound


class IncidentAlert(NamedTuple):
    """What an on_incident callable is given; a command finds the same in DDPWATCH_INCIDENT_* variables."""

    folder: str  # the incident folder ('' when no report could be written anywhere)
    summary: str  # one line: kind, culprits, what happened, and the folder
    kind: str
    culprits: tuple
    run_id: str
    trigger: str


MAX_DETAIL = 240  # characters of the finding's own summary an alert quotes


def quoted_detail(text) -> str:
    """A finding's summary as an alert quotes it: it names lines, functions and ops the ranks' records hold, and a
    record can come from anyone who reaches the store's port, so it is one line, ASCII, its quotes escaped, in
    double quotes, at most MAX_DETAIL characters."""
    flat = json.dumps(" ".join(str(text).split()), ensure_ascii=True)[1:-1]
    return '"' + (flat if len(flat) <= MAX_DETAIL else flat[: MAX_DETAIL - 3] + "...") + '"'


def alert_of(incident: dict, folder: str | None, held_back: int = 0) -> IncidentAlert:
    """The alert: made of what this rank decided (the kind, from ddpwatch's own table; the culprits, integers;
    whether it is a fact or a reading; the folder it wrote), then the finding's summary, quoted (quoted_detail)."""
    findings = incident.get("findings") or []
    first = findings[0] if findings else {}
    kind = str(first.get("kind") or "hang")
    culprits = tuple(r for r in first.get("ranks") or () if type(r) is int)
    status = (first.get("basis") or {}).get("status")
    line = (
        f"ddpwatch: {kind}"
        + (f" (culprit {wording.rank_list(list(culprits))})" if culprits else "")
        + (" - a reading, not acted on" if status == "reading" else "")
        + f". Report: {folder or '(none could be written)'}"
        + (f". {held_back} earlier alert(s) of this kind held back" if held_back else "")
        + (f". Detail: {quoted_detail(first['summary'])}" if first.get("summary") else "")
    )
    line = visible(line)  # the folder is the user's own path: still, nothing in it may drive a terminal
    return IncidentAlert(
        folder or "", line, kind, culprits, str(incident.get("run_id") or ""), str(incident.get("trigger") or "")
    )


def announce(config, incident: dict, folder: str | None, throttle: AlertThrottle | None = None) -> None:
    """The verdict on the `ddpwatch` logger, then the on_incident hook started; returns at once, never raises. A
    dump (SIGUSR1, `ddpwatch dump`) was asked for by someone who is there: no alert. `throttle`: one alert per
    finding kind per window (throttle.py); one held back is said on stderr's report only."""
    if incident.get("trigger") == analysis.DUMP:
        return
    try:
        kind = str(((incident.get("findings") or [{}])[0]).get("kind") or "hang")
        go, held_back = (True, 0) if throttle is None else throttle.allow(kind)
        if not go:
            log.info("ddpwatch: alert for %s held back (one per kind per %g s)", kind, ALERT_EVERY_S)
            return
        alert = alert_of(incident, folder, held_back)
        log_verdict(alert)
        if config.on_incident is not None:
            start_hook(config.on_incident, alert)
    except Exception:
        log.warning("ddpwatch: could not announce the incident", exc_info=True)


def log_verdict(alert: IncidentAlert) -> None:
    """An ERROR record carrying the alert (`record.ddpwatch_incident`, a dict) for the handlers the job has (files,
    W&B, MLflow, a log shipper). Without any handler the report on stderr says it already: Python's last-resort
    handler would only print it twice."""
    if log.hasHandlers():
        log.error("%s", alert.summary, extra={"ddpwatch_incident": alert._asdict()})


def start_hook(hook, alert: IncidentAlert) -> threading.Thread:
    """Run the hook on a daemon thread of its own: neither the report, the abort nor training waits for it."""
    target = _run_callable if callable(hook) else _run_command
    thread = threading.Thread(target=target, args=(hook, alert), name="ddpwatch-on-incident", daemon=True)
    thread.start()
    return thread


def _run_command(command: str, alert: IncidentAlert) -> None:
    try:
        supervisor = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, str(ON_INCIDENT_TIMEOUT_S), command],
            env=hook_environ(alert),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except Exception as exc:
        log.warning("ddpwatch: could not start the on_incident command %r: %s", command, exc)
        return
    try:
        status = supervisor.wait(ON_INCIDENT_TIMEOUT_S + WAIT_MARGIN_S)
    except subprocess.TimeoutExpired:
        status = TIMED_OUT
    if status == TIMED_OUT:
        log.warning("ddpwatch: the on_incident command %r ran past %g s and was killed", command, ON_INCIDENT_TIMEOUT_S)
    elif status != 0:
        log.warning("ddpwatch: the on_incident command %r failed with exit status %s", command, status)


def _run_callable(hook, alert: IncidentAlert) -> None:
    """The callable on a thread of its own; this one only says when it fails or overruns (a thread cannot be
    killed: an overrunning one is left behind, a daemon that does not keep the process alive)."""

    def call():
        try:
            hook(alert)
        except BaseException:
            log.warning("ddpwatch: the on_incident callable %r raised", hook, exc_info=True)

    worker = threading.Thread(target=call, name="ddpwatch-on-incident-call", daemon=True)
    worker.start()
    worker.join(ON_INCIDENT_TIMEOUT_S)
    if worker.is_alive():
        log.warning(
            "ddpwatch: the on_incident callable %r still runs after %g s; left running, not waited for",
            hook,
            ON_INCIDENT_TIMEOUT_S,
        )


def hook_environ(alert: IncidentAlert) -> dict:
    return incident_hook_environ((alert.folder, alert.summary, alert.kind, ",".join(map(str, alert.culprits))))
