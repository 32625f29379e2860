"""A fork server for the real tests' ranks: one process per pytest worker imports torch once and forks ranks from it.

Why: importing torch is about 2 s of CPU, most of a gloo rank's start-up, and the suite starts hundreds of ranks on
2 cores (CPU-bound: issue 43 item 6). A rank forked from here runs its scenario as `python script.py args` would
(argv, sys.path[0], environment, working directory, standard streams, process group, exit status, interpreter exit
with atexit and non-daemon threads), with torch already in sys.modules, as after a script's first line.

What it does not stand in for, and therefore never gets (the client falls back to a plain exec): anything decided
at interpreter start-up - DDPWATCH set (the site hook), a PYTHON*, TORCH*, GLOO*, NCCL*, thread-count or LD_*
variable differing from this server's, `-m`/`-c` or interpreter options, an interpreter other than this one, a rank
whose output is not captured. DDPWATCH_TEST_EXEC=1 turns the server off: every rank is exec'd, as before it existed.
"""

import gc
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Read by the interpreter or a native library when the process starts, not when the script reads them: a rank whose
# value differs from the server's must be exec'd.
START_UP_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH")
# torch's, gloo's and NCCL's own variables: some are read when torch is imported; not worth telling which.
START_UP_PREFIXES = ("PYTHON", "TORCH", "GLOO", "NCCL")
SERVER_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # what run_ranks gives every rank
REAP_EVERY_S = 0.02


def decided_at_start_up(name: str) -> bool:
    return name.startswith(START_UP_PREFIXES) or name in START_UP_VARIABLES or name == "DDPWATCH"  # DDPWATCH: site hook


class ForkedRank:
    """The Popen surface run_ranks uses (pid, poll, wait, returncode) for a rank the server forked."""

    def __init__(self, server, pid):
        self.server, self.pid, self.returncode = server, pid, None
        self.args = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.server.exit_status(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = self.server.exit_status(self.pid, 0.5 if left is None else min(left, 0.5))
        return self.returncode


class Server:
    """The client side: starts the server on first use, sends it one request per rank (with the rank's streams),
    and collects the exit statuses it sends back."""

    def __init__(self):
        self.lock = threading.Lock()
        self.statuses: dict = {}
        self.started: dict = {}
        self.env = self.server_env()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        # A session of its own: a rank group killed never takes the server with it; no PYTEST_CURRENT_TEST, so the
        # leftover check never counts the server as some test's process (its ranks are checked as its children).
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=self.env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()
        self.next_id = 0

    @staticmethod
    def server_env() -> dict:
        """This worker's environment without DDPWATCH*, as run_case gives it to its ranks: the server's own."""
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("DDPWATCH")}
        env.pop("PYTEST_CURRENT_TEST", None)
        env.update(SERVER_ENV)
        root = os.path.dirname(HERE)
        env["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")  # what run_case gives its ranks
        return env

    def can_fork(self, command, env) -> bool:
        if len(command) < 2 or command[0] != sys.executable or not command[1].endswith(".py"):
            return False
        if command[1].startswith("-") or not os.path.isfile(command[1]):
            return False
        names = {n for n in set(env) | set(self.env) if decided_at_start_up(n)}
        return all(env.get(n) == self.env.get(n) for n in names)

    def popen(self, command, env, stdout, stderr, cwd=None, process_group=0, **ignored):
        """Fork a rank running command[1] with argv command[1:]; the Popen keywords run_ranks passes."""
        with open(os.devnull) as devnull:
            fds = [devnull.fileno(), stdout.fileno(), stderr.fileno()]
            with self.lock:
                self.next_id += 1
                request = {"id": self.next_id, "argv": list(command[1:]), "env": dict(env), "cwd": cwd}
                request["pgid"] = process_group
                socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            pid = self._await(lambda: self.started.pop(request["id"], None), 60.0)
        if pid is None:
            raise RuntimeError("the rank fork server did not answer in 60 s")
        return ForkedRank(self, pid)

    def exit_status(self, pid, timeout):
        return self._await(lambda: self.statuses.pop(pid, None), timeout)

    def _await(self, found, timeout):
        """found()'s answer once the server's messages hold it, or None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                answer = found()
                if answer is not None:
                    return answer
                left = deadline - time.monotonic()
                wait = max(0.0, min(left, 0.05))
                while select.select([self.sock], [], [], wait)[0]:
                    self._take(self.sock.recv(65536))
                    wait = 0.0
                answer = found()
            if answer is not None or left <= 0:
                return answer

    def _take(self, message: bytes) -> None:
        if not message:
            raise RuntimeError("the rank fork server exited")
        answer = json.loads(message)
        if "started" in answer:
            self.started[answer["started"]] = answer["pid"]
        else:
            self.statuses[answer["pid"]] = answer["exit"]

    def ranks_alive(self) -> list:
        """The pids of the server's children still running (a test's ranks that outlived it)."""
        import psutil

        try:
            children = psutil.Process(self.process.pid).children()
            return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            return []

    def close(self) -> None:
        self.sock.close()  # the server exits on end of file
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_server = None


def server():
    """This worker's server, started on first use; None when DDPWATCH_TEST_EXEC=1 asks for plain exec."""
    global _server
    if os.environ.get("DDPWATCH_TEST_EXEC") == "1":
        return None
    if _server is not None and _server.process.poll() is not None:
        # It died (killed, out of memory): a new one, or every later test of this worker would fail for it.
        _server.sock.close()
        _server = None
    if _server is None:
        import atexit

        _server = Server()
        atexit.register(_server.close)
    return _server


def running() -> "Server | None":
    return _server


def start(command, **kwargs):
    """subprocess.Popen for run_ranks: a fork of this worker's server where nothing decided at start-up differs, an
    exec otherwise."""
    return start_with(server(), command, **kwargs)


def start_with(chosen, command, **kwargs):
    streams = kwargs.get("stdout") is not None and kwargs.get("stderr") is not None
    if chosen is not None and streams and chosen.can_fork(command, kwargs.get("env") or os.environ):
        try:
            return chosen.popen(command, **kwargs)
        except (OSError, RuntimeError):
            if chosen.process.poll() is None:
                raise  # the server lives: a fault of the request, not of the server
            # the server died under this request: this rank is exec'd, and server() starts a new one next time
    return subprocess.Popen(command, **kwargs)


# ---- the server: `python zygote.py FD` ------------------------------------------------------------------------------


def _serve(sock) -> dict:
    """Answer requests until the client goes; in a forked child, return its request (the child runs it)."""
    children: set = set()
    while True:
        readable, _, _ = select.select([sock], [], [], REAP_EVERY_S if children else None)
        _reap(sock, children)
        if not readable:
            continue
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not message:
            for fd in fds:
                os.close(fd)
            sys.exit(0)
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            sock.close()
            _become_rank(request, fds)
            return request
        for fd in fds:
            os.close(fd)
        try:
            os.setpgid(pid, request["pgid"])  # also here: a group's next rank may be forked before this one ran
        except OSError:
            pass
        children.add(pid)
        sock.send(json.dumps({"started": request["id"], "pid": pid}).encode())


def _reap(sock, children: set) -> None:
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            children.discard(pid)
            sock.send(json.dumps({"pid": pid, "exit": os.waitstatus_to_exitcode(status)}).encode())


def _become_rank(request: dict, fds: list) -> None:
    try:
        os.setpgid(0, request["pgid"])
    except OSError:
        pass
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if request["cwd"]:
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)  # as `python script.py` sets it (this server's own folder otherwise)


if __name__ == "__main__":
    import torch  # noqa: F401  (the point: every rank forked from here has it)
    import torch.distributed  # noqa: F401

    # Out of the collector's reach: a collection in a rank would otherwise write to every object torch made here,
    # copying the pages the fork shares (copy on write) and paying back much of the import it saved.
    gc.freeze()
    _rank = _serve(socket.socket(fileno=int(sys.argv[1])))
    import runpy

    runpy.run_path(os.path.abspath(_rank["argv"][0]), run_name="__main__")
