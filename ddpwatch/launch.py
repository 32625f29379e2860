"""Starts N local ranks of a script on gloo in one process group, with a hard time limit; used by demo and tests."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import socket
import subprocess
import tempfile
import time


FIXED_PORTS_FROM = 10000  # the lowest port free_port() picks from below the kernel's ephemeral range


def free_port() -> int:
    """A port for a job's store that no one holds now, picked below the kernel's ephemeral range where it can be:
    a port the kernel handed out (bind to 0) and released can be handed out again at once, to another job's gloo
    connection, before the store listens on it (EADDRINUSE in tests running side by side)."""
    low = _ephemeral_low()
    if low is not None and low - FIXED_PORTS_FROM >= 1000:
        chooser = random.Random(os.getpid() ^ time.monotonic_ns())
        for _ in range(50):
            port = chooser.randrange(FIXED_PORTS_FROM, low)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_low() -> int | None:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    """Whether a listening socket can take `port` on every address now (the store listens on all of them)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


@dataclasses.dataclass
class RankResult:
    rank: int
    returncode: int | None
    stdout: str
    stderr: str


def kill_tree(pid: int) -> None:
    """SIGKILL the process `pid`, its session and every descendant with theirs: torchrun starts each worker in a
    session of its own, which killing torchrun's session leaves running. The descendants are found first, while
    `pid` still holds them."""
    import psutil

    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    for member in [pid] + [process.pid for process in descendants]:
        for kill in (os.killpg, os.kill):
            try:
                kill(member, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _kill_group(pgid: int | None) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_ranks(
    command: list,
    nprocs: int,
    env: dict | None = None,
    timeout: float = 120.0,
    capture: bool = True,
    cwd: str | None = None,
    stop_when=None,
    start=subprocess.Popen,
) -> list:
    """Run `command` as ranks 0..nprocs-1 (RANK/WORLD_SIZE/MASTER_* set); kill the whole group at the limit.

    `stop_when`: a callable polled while the ranks run; once it returns true the whole group is killed
    (for jobs that are meant to stay hung, e.g. a stopped rank). `start`: what starts a rank, with Popen's
    signature (the test suite's fork server; subprocess.Popen otherwise).
    """
    port = free_port()
    base = dict(os.environ if env is None else env)
    base.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(nprocs),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    procs, pgid, files = [], None, []
    try:
        for rank in range(nprocs):
            rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            kwargs: dict = {"process_group": 0 if pgid is None else pgid}
            # Files, not pipes: a rank blocked on a full pipe nobody reads would look like a hang.
            streams = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) if capture else (None, None)
            files.append(streams)
            proc = start(
                command,
                env=rank_env,
                stdout=streams[0],
                stderr=streams[1],
                text=True,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                **kwargs,
            )
            if pgid is None:
                pgid = proc.pid
            procs.append(proc)
        deadline = time.monotonic() + timeout
        while stop_when is not None and time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if stop_when():
                time.sleep(0.5)  # let a report being finished land
                _kill_group(pgid)
                break
            time.sleep(0.2)
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(pgid)
                proc.wait()
        return [
            RankResult(rank, proc.returncode, _read(files[rank][0]), _read(files[rank][1]))
            for rank, proc in enumerate(procs)
        ]
    finally:
        if pgid is not None:
            _kill_group(pgid)  # nothing this started outlives it, whatever happened above
        for proc in procs:
            if proc.poll() is None:
                proc.wait()
        for streams in files:
            for handle in streams:
                if handle is not None:
                    handle.close()


def _read(handle) -> str:
    if handle is None:
        return ""
    handle.seek(0)
    return handle.read()
