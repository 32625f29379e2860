"""A rank that the backend aborts (gloo's size check, a C++ terminate) leaves its Python stack behind, via faulthandler.

An abort in C++ gives Python no chance to run: no except, no atexit, no watchdog round. faulthandler can still
write every thread's Python stack from its signal handler, so each rank points it at a file of its own in this
user's private temp folder (`<tmp>/ddpwatch-<uid>/faults/<job>-rank-<r>-pid-<pid>.txt`, `<job>` the random token
the job's ranks agreed on: two jobs started in the same second no longer share names), removed when the rank ends
normally (no file in the user's report folder for a run that never fails); a rank killed outright leaves its file,
and the next armed start of the same user sweeps those whose process is gone (sweep()). A surviving rank whose
collective failed because that peer vanished reads the file into the dead rank's view (with its last published
positions), and analysis/silent.py names both lines: the one the dead rank died in and the survivor's own.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import time

from .. import analysis, private

from ..capture.sites import is_internal_file

log = logging.getLogger("ddpwatch")

FOLDER = "faults"
MAX_BYTES = 256 * 1024  # a fault file is a few KiB; anything bigger is not faulthandler's
_FATAL = re.compile(r"^Fatal Python error: (.+)$", re.M)
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')


SWEEP_AFTER_S = 600.0  # a dead process's fault file is kept this long: its survivors read it within seconds
_NAME = re.compile(r"[0-9a-f]{16}-rank-\d+-pid-(\d+)\.txt")
_OLD_NAME = re.compile(r"\d{8}-\d{6}-rank-\d+\.txt")  # before issue 41: named by the second the job started


def _job_name(token: str) -> str:
    return re.sub(r"[^0-9a-f]", "_", token or "job")[:32]


def fault_path(token: str, rank: int, pid: int) -> str:
    """This process's fault file as rank `rank` of the job `token` (the store's: store.JOB_TOKEN)."""
    return os.path.join(private.private_path(FOLDER), f"{_job_name(token)}-rank-{rank}-pid-{pid}.txt")


def find_fault(token: str, rank: int) -> str | None:
    """The newest fault file of rank `rank` of the job `token` on this host, or None."""
    folder = private.private_path(FOLDER)
    prefix = f"{_job_name(token)}-rank-{rank}-pid-"
    found = [os.path.join(folder, name) for name in os.listdir(folder) if name.startswith(prefix)]
    return max(found, key=_mtime) if found else None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's, or not a pid: not ours to judge
    return True


def sweep(now: float | None = None) -> int:
    """Remove the fault files of processes gone for SWEEP_AFTER_S (ranks killed outright leave theirs), and those of
    the older naming past it; returns how many. Never raises: it runs as a rank arms."""
    now = time.time() if now is None else now
    removed = 0
    try:
        folder = private.private_path(FOLDER)
        names = os.listdir(folder)
    except (OSError, private.UnsafeFolder):
        return 0
    for name in names:
        named = _NAME.fullmatch(name)
        if named is None and not _OLD_NAME.fullmatch(name):
            continue
        path = os.path.join(folder, name)
        if now - _mtime(path) < SWEEP_AFTER_S or (named is not None and _alive(int(named.group(1)))):
            continue
        try:
            os.remove(path)
            removed += 1
        except OSError:
            pass
    return removed


class FaultFile:
    """faulthandler writing this rank's stacks to its own file while armed; nothing when the user set it up."""

    def __init__(self, path: str | None, handle):
        self.path = path
        self._handle = handle

    @classmethod
    def arm(cls, token: str, rank: int) -> "FaultFile":
        sweep()
        if faulthandler.is_enabled():
            return cls(None, None)  # the program's own faulthandler (or python -X faulthandler) stays as it is
        try:
            path = fault_path(token, rank, os.getpid())
            handle = open(path, "w", encoding="utf-8")
            faulthandler.enable(file=handle, all_threads=True)
        except (OSError, ValueError, RuntimeError, private.UnsafeFolder) as exc:
            log.info("ddpwatch: no fault file for this rank (%s); a crash will leave no Python stack", exc)
            return cls(None, None)
        return cls(path, handle)

    def disarm(self) -> None:
        """The rank ends normally: faulthandler off, its empty file gone."""
        if self._handle is None or self.path is None:  # not armed (a handle comes with its path)
            return
        try:
            faulthandler.disable()
            self._handle.close()
            os.remove(self.path)
        except OSError:
            pass  # removed already: nothing to keep
        self._handle = None


def read_fault(path: str) -> dict | None:
    """{"error": "Aborted", "stacks": [...]} from a fault file faulthandler wrote, or None (empty, missing, other)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(MAX_BYTES)
    except OSError:
        return None
    fatal = _FATAL.search(text)
    if fatal is None:
        return None
    return {"error": fatal.group(1).strip(), "stacks": _stacks(text), "file": path}


def _stacks(text: str) -> list:
    """faulthandler's threads (innermost frame first) as ddpwatch stacks (innermost last); the main thread is the
    one whose outermost frame is the program's module level."""
    threads: list = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append({"thread": head.group(2), "frames": []})
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].append(
                {
                    "file": frame.group(1),
                    "line": int(frame.group(2)),
                    "function": frame.group(3).strip(),
                    "internal": is_internal_file(frame.group(1)),
                }
            )
    stacks = []
    for thread in threads:
        frames = thread["frames"][::-1]
        main = bool(frames) and frames[0]["function"] == "<module>"
        stacks.append({"thread": "MainThread" if main else thread["thread"], "main": main, "frames": frames})
    stacks.sort(key=lambda stack: not stack["main"])
    return stacks


def add_crash_evidence(silent: dict, job) -> None:
    """Into each vanished peer's view (peers.vanished_peers): the stacks its fault file holds and its last published
    positions, when it died on this host and left one."""
    for rank, view in silent.items():
        if (view.get("process") or {}).get("exists") is not False:
            continue
        try:
            path = find_fault(job.job_token, rank)
            fault = read_fault(path) if path else None
        except (OSError, private.UnsafeFolder):
            fault = None
        if fault is None:
            continue
        last = dict(view.get("last_state") or {"rank": rank}, stacks=fault["stacks"])
        fingerprints = job.fingerprints([rank]).get(rank)
        if fingerprints:
            last["fingerprints"] = fingerprints
        view["last_state"] = last
        view["fault"] = {"error": fault["error"], "file": fault["file"]}


FAILURE_REPORT_S = 4.0  # how long the watchdog looks for the peer that vanished after a collective failed
# The process exits (the user's error left the guard, or a SIGTERM came) with a peer's failure seen: it looks this
# long at most, every LAST_LOOK_EVERY_S, because the peer that crashed may not be gone yet (gloo's size-mismatch
# abort dumps core; under load rank 1 still lived at the one look there was: no report, 2 runs in 40 beside a
# full suite and a CPU-bound process). The exit waits for it only when a collective failed on a peer gone.
LAST_LOOK_S = 2.0
LAST_LOOK_EVERY_S = 0.1


def look_until_gone(peers, job, config, stopping, linger=True, clock=time.monotonic, pause=time.sleep) -> dict:
    """{rank: view} of the peers gone: looked for every interval during FAILURE_REPORT_S, or, once `stopping` is
    set, every LAST_LOOK_EVERY_S until LAST_LOOK_S from the first look (once only unless `linger`: a SIGTERM's look
    holds up no stop that has no crash behind it); {} when none went."""
    start = clock()
    while True:
        silent = peers.vanished_peers(job.positions(), clock())  # positions: every round
        ending = stopping.is_set()
        if silent or (ending and not linger) or clock() - start >= (LAST_LOOK_S if ending else FAILURE_REPORT_S):
            return silent
        if ending:
            pause(LAST_LOOK_EVERY_S)
        else:
            stopping.wait(config.interval)


def vanished(peers, job, config, stopping, own_state, linger=True) -> tuple:
    """({rank: view} of the peers gone after a collective failed, their findings): looked for during
    FAILURE_REPORT_S, LAST_LOOK_S when `stopping` (the process exits: the user's error ended it); each view with the
    peer's history and, when the backend aborted it here, its fault file's stacks (mismatch_crash names both lines)."""
    silent = look_until_gone(peers, job, config, stopping, linger)
    if not silent:
        return {}, []
    histories = job.with_history({rank: view["last_state"] for rank, view in silent.items()})
    for rank, view in silent.items():
        view["last_state"] = histories[rank]  # the report shows its records too, from its last whole state
    add_crash_evidence(silent, job)
    own = own_state()
    return silent, analysis.stage_findings(analysis.STAGE_SILENT, silent, {own["rank"]: own}, config.grace)


# A rank a signal came to end (SIGTERM, SIGINT, SIGHUP) starts no new look for a hang for this long; one that still
# lives then was kept by the program's own handler (a SIGHUP that reloads a configuration), and is watched again.
ENDING_LOOK_S = 10.0


def vanished_incident(
    peers, job, config, stopping, own_state, crashed_only: bool
) -> tuple[analysis.Assessment, dict] | None:
    """(assessment, {rank: view}) of the peers gone after a collective failed (vanished, above), or None: nothing to
    report. The watchdog claims and writes it, once per set of ranks (the assessment's fingerprint).

    `crashed_only`: a SIGTERM's look (`stopping` is then its event), one look, not FAILURE_REPORT_S of them (else
    `stopping` is the watchdog's own stop: a collective failed on a peer gone, LAST_LOOK_S of looks). torchrun
    SIGTERMs the other ranks once one has exited, and under load that can come before this rank's collective has
    failed (the peer's abort closed the connection; gloo has not raised in Python yet): the report of the peer's
    failure was lost (gloo's size-mismatch abort: 2 runs in 21 beside four CPU-bound processes). Only a peer that
    crashed (its fault file: the backend aborted it) is reported then: a launcher ending every rank (the user's
    Ctrl-C) has its ranks go one after another, none crashed, and none is to blame. A peer a signal ended (a
    scheduler's SIGTERM to every rank) published its exit first (signals.py), so it is no vanished peer at all; one
    that vanished without a word (os._exit, SIGKILL, a segfault) is reported even while torchrun's SIGTERM ends this
    rank."""
    silent, findings = vanished(peers, job, config, stopping, own_state, linger=not crashed_only)
    if not silent or (crashed_only and not all("fault" in view for view in silent.values())):
        return None
    fingerprint = "peer-failure-" + "-".join(str(r) for r in sorted(silent))
    return analysis.Assessment(analysis.SILENT, findings, fingerprint), silent
