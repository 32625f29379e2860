"""The registry of armed local ranks: <tempdir>/ddpwatch-<uid>/ranks/<pid>.json, written by a live rank while it
is armed (watch/signals.py), read and signalled by `ddpwatch dump` (dump_client.py)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import stat
import threading
import time

from . import atomic, private

log = logging.getLogger("ddpwatch")


# ----- the registry: <tempdir>/ddpwatch-<uid>/ranks/<pid>.json, one file per armed rank on this host -----
#
# Other users share the temp dir, so the folders are private and checked (private.py), every file is read and
# removed through the folder's descriptor, and only files that ddpwatch itself writes are touched: named
# <pid>.json, regular, owned by this user. An entry is believed only while the process at its pid still has the
# start time and the program name the entry recorded: a pid reused after a SIGKILL, or an entry naming any other
# process, is never signalled.

ENTRY_NAME = re.compile(r"^([1-9][0-9]{0,9})\.json$")
MAX_ENTRY_BYTES = 64 * 1024
SAME_START_S = 0.05  # psutil's start time of one process never moves; another process at the same pid differs
_O_READ = os.O_RDONLY | private.NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def registry_dir() -> str:
    return os.path.join(private.root_path(), "ranks")


def _open_registry(folder: str | None) -> int:
    if folder is None:
        return private.open_private("ranks")
    parent, name = os.path.split(os.path.abspath(folder))
    parent_fd = os.open(parent, os.O_RDONLY)
    try:
        return private.open_child(parent_fd, name, folder)
    finally:
        os.close(parent_fd)


def _identity(pid: int) -> tuple | None:
    """(start time, program name, real uid) of the process at `pid`, None when there is none or psutil cannot say."""
    try:
        import psutil

        proc = psutil.Process(pid)
        with proc.oneshot():
            return proc.create_time(), proc.name(), proc.uids().real
    except Exception:
        return None


def register(entry: dict, folder: str | None = None) -> str | None:
    """Write this process's entry atomically; returns its path, or None when the folder cannot be used."""
    pid = entry["pid"]
    identity = _identity(pid)
    entry = {key: value for key, value in entry.items() if key != "argv"}  # arguments may hold secrets (--token)
    entry.update(
        host=socket.gethostname(),
        created=identity and identity[0],
        command=identity and identity[1],
        registered_at=time.time(),
    )
    shown = folder or registry_dir()
    try:
        fd = _open_registry(folder)
    except private.UnsafeFolder as exc:
        log.warning("ddpwatch: no `ddpwatch dump` for this rank: %s", exc)
        return None
    except OSError as exc:
        log.info("ddpwatch: cannot register this rank for `ddpwatch dump` (%s)", exc)
        return None
    try:
        name = f"{pid}.json"
        atomic.write_file(fd, name, json.dumps(entry).encode(), mode=0o600, temp=f".{pid}.{threading.get_ident()}.tmp")
        _scan(fd)  # prunes entries of ranks that ended without unregistering (SIGKILL)
        return os.path.join(shown, name)
    except OSError as exc:
        log.info("ddpwatch: cannot register this rank for `ddpwatch dump` (%s)", exc)
        return None
    finally:
        os.close(fd)


def unregister(path: str | None) -> None:
    if path and ENTRY_NAME.match(os.path.basename(path)):
        try:
            os.remove(path)
        except OSError:
            pass


def is_current(entry: dict) -> bool:
    """Whether the process at the entry's pid is the one that wrote it: same start time, same program, this user."""
    pid, created, command = entry.get("pid"), entry.get("created"), entry.get("command")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if not isinstance(created, (int, float)) or not isinstance(command, str):
        return False
    identity = _identity(pid)
    if identity is None:
        return False
    started, name, uid = identity
    return abs(started - created) < SAME_START_S and name == command and uid == os.getuid()


def _read_entry(fd: int, name: str) -> tuple:
    """(entry, inode) of a registry file ddpwatch wrote, or (None, None) for anything else (left alone)."""
    match = ENTRY_NAME.match(name)
    if not match:
        return None, None
    try:
        handle = os.open(name, _O_READ, dir_fd=fd)
    except OSError:
        return None, None  # a symlink (ELOOP), gone meanwhile, or unreadable: not ours to judge
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > MAX_ENTRY_BYTES:
            return None, None
        entry = json.loads(os.read(handle, MAX_ENTRY_BYTES + 1).decode("utf-8"))
    except (OSError, ValueError):
        return None, None  # being written, or damaged
    finally:
        os.close(handle)
    if not isinstance(entry, dict) or entry.get("pid") != int(match.group(1)):
        return None, None
    return entry, (info.st_dev, info.st_ino)


def _scan(fd: int) -> list:
    """The entries of ranks still running; entries ddpwatch wrote for processes now gone (or replaced) removed."""
    entries = []
    for name in sorted(os.listdir(fd)):
        entry, inode = _read_entry(fd, name)
        if entry is None:
            continue
        if is_current(entry):
            entries.append(entry)
            continue
        try:  # remove it only if it is still the file just read (the pid's new owner may have registered since)
            now = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == inode:
                os.unlink(name, dir_fd=fd)
        except OSError:
            pass
    return sorted(entries, key=lambda e: (str(e.get("job", "")), str(e.get("master", "")), rank_of(e)))


def rank_of(entry: dict) -> int:
    rank = entry.get("rank")
    return rank if isinstance(rank, int) else -1


def registry(folder: str | None = None) -> list:
    """Entries of armed ranks still running, sorted by (job, rank); an unusable registry folder raises
    (private.UnsafeFolder says why in one line)."""
    fd = _open_registry(folder)
    try:
        return _scan(fd)
    finally:
        os.close(fd)


def signal_rank(entry: dict, signum: int) -> bool:
    """Send `signum` to the entry's process only if it is still the process that registered; False otherwise.

    With a pidfd the check and the signal concern one process for sure: the descriptor is taken first, then the
    pid is checked; if the process died and the pid was reused in between, the check fails or the descriptor
    points at a process that is gone, and nothing is signalled."""
    pidfd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = os.pidfd_open(entry["pid"])
        except OSError:
            return False
    try:
        if not is_current(entry):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(entry["pid"], signum)
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def job_key(entry: dict) -> str:
    """How `ddpwatch dump` names a job: the launcher's job id, else the rendezvous address, else the pid."""
    return entry.get("job") or entry.get("master") or f"pid {entry.get('pid')}"
