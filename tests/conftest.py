"""Shared test fixtures: every test must leave no ddpwatch patch, thread or child process behind; the test tiers."""

import multiprocessing.process
import os
import subprocess
import sys
import threading
import time
import types
import warnings

import pytest
import torch  # noqa: F401  (its first import may run ldconfig, ctypes.util.find_library: not a test's process)
from hypothesis import Phase, settings

sys.path.insert(0, os.path.dirname(__file__))

import zygote  # noqa: E402  (from this folder, put on the path just above)

# ----- test tiers -----
# `real`: the test starts a process (ranks, torchrun, the CLI, a benchmark, a browser) or sleeps. Every test of a
# test_real_*.py file is real; elsewhere a test says so with @pytest.mark.real (a whole file with `pytestmark`).
# The fast tier is everything else: `python -m pytest -m "not real"`, no process and no sleep, under a minute.
# (The marker is declared in setup.cfg's [tool:pytest], which runs with --strict-markers.)
# A test outside the tier that starts a process or sleeps fails, naming what it started.
REAL_FILE_PREFIX = "test_real_"

# The fuzz tests' example count (tests/test_crafted_input.py): a small default sized to the suite's time budget,
# `--hypothesis-profile=long` for a longer hunt (HYPOTHESIS_PROFILE=long works too; with --timeout=0).
# By default a failing example is reported as found, not shrunk: shrinking runs the test again hundreds of times,
# for up to 5 minutes (Hypothesis's own cap), past the 120 s limit (setup.cfg), which then ends the run with a
# stack and no example (see _thread_timeout). The examples are small (a seed document with at most 4 changes,
# 300 bytes), every draw is printed, and a @reproduce_failure line (print_blob) runs the same one again. The long
# profile shrinks.
UNSHRUNK = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)
settings.register_profile("ddpwatch", max_examples=100, phases=UNSHRUNK, print_blob=True)
settings.register_profile("long", max_examples=5000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ddpwatch"))


def pytest_addoption(parser):
    parser.addoption(
        "--recorder",
        choices=("auto", "python", "flight"),
        default=None,
        help="run the ranks the real tests start with this recorder (DDPWATCH_RECORDER; docs/how-it-works.md)",
    )


def pytest_configure(config):
    # The ranks the real tests start (hundreds of processes) read ddpwatch's bytecode from __pycache__ instead of
    # compiling every module again (0.2 s of CPU each) where the machine sets PYTHONDONTWRITEBYTECODE.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    recorder = config.getoption("--recorder", None)
    if recorder:
        os.environ["DDPWATCH_RECORDER"] = recorder  # inherited by every rank and torchrun job the tests start


@pytest.fixture(autouse=True)
def fast_tier_records_with_the_default(request):
    """`--recorder` is for the real tier's ranks: a fast-tier test's in-process session is a unit test of the
    recorder it asks for (or of the default), not of the one the run was started with. (Not monkeypatch: a test
    that calls monkeypatch.undo() would undo this too.)"""
    asked = None if request.node.get_closest_marker("real") else os.environ.pop("DDPWATCH_RECORDER", None)
    try:
        yield
    finally:
        if asked is not None:
            os.environ["DDPWATCH_RECORDER"] = asked


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name.startswith(REAL_FILE_PREFIX):
            item.add_marker(pytest.mark.real)
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(_thread_timeout(item), append=False)  # before a marker of its own: the closest
    items.sort(key=_start_order)


def _start_order(item) -> int:
    """Long work first, the fast tier last: xdist hands tests out in this order, and 1,300 tests of a few ms each
    fill the workers' last minute where, in file order, one worker was left running the CPU-bound group alone
    while the other two idled (the suite was CPU-bound at 181% of 2 cores over 476 s). The sort is stable."""
    if any(
        marker.kwargs.get("name", marker.args[0] if marker.args else None) == "cpu_bound"
        for marker in item.iter_markers("xdist_group")
    ):
        return 0
    return 1 if item.get_closest_marker("real") else 2


def _thread_timeout(item):
    """A Hypothesis test's time limit (setup.cfg's `timeout`, or its own marker's) by pytest-timeout's thread
    method. The default method, signal, raises pytest's Failed inside the test; Hypothesis catches that as a
    failing example and goes on: it shrinks it, running the slow example again and again with no alarm left (one
    such run went on for over 20 minutes). The thread method dumps every thread's stack and ends the process (under
    xdist: the worker, which xdist reports as crashed and replaces); these tests start no process to leave behind."""
    marker = item.get_closest_marker("timeout")
    timeout = None if marker is None else marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    return pytest.mark.timeout(method="thread") if timeout is None else pytest.mark.timeout(timeout, method="thread")


@pytest.fixture(autouse=True)
def fast_tier_starts_no_process(request):
    """Outside the `real` tier: fail a test that starts a process or sleeps on the test's thread (it runs all the
    same, so that the failure names everything it did)."""
    if request.node.get_closest_marker("real"):
        yield
        return
    seen = []
    popen_init, fork, start, sleep = (
        subprocess.Popen.__init__,
        os.fork,
        multiprocessing.process.BaseProcess.start,
        time.sleep,
    )
    test_thread = threading.current_thread()

    def noted_popen_init(self, args, *more, **kwargs):
        seen.append(f"started a process: {args!r}"[:300])
        popen_init(self, args, *more, **kwargs)

    def noted_fork():
        seen.append("called os.fork()")
        return fork()

    def noted_start(self):
        seen.append(f"started a multiprocessing process: {self!r}")
        return start(self)

    def noted_sleep(seconds):
        if threading.current_thread() is test_thread:
            seen.append(f"slept (time.sleep({seconds!r}))")
        return sleep(seconds)

    subprocess.Popen.__init__, os.fork, time.sleep = noted_popen_init, noted_fork, noted_sleep
    multiprocessing.process.BaseProcess.start = noted_start
    try:
        yield
    finally:
        subprocess.Popen.__init__, os.fork, time.sleep = popen_init, fork, sleep
        multiprocessing.process.BaseProcess.start = start
    if seen:
        pytest.fail(
            f"{request.node.nodeid} is in the fast tier but {seen[0]}"
            + (f" (and {len(seen) - 1} more)" if len(seen) > 1 else "")
            + ": mark it @pytest.mark.real (tests/conftest.py)",
            pytrace=False,
        )


@pytest.fixture
def one_rank_group():
    """Call it to initialise a 1-rank gloo process group (inside a guard or not); destroyed after the test."""
    import datetime

    import torch.distributed as dist

    from ddpwatch.launch import free_port

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
    yield lambda: dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    if dist.is_initialized():
        dist.destroy_process_group()


LEFT_BEHIND_GRACE_S = 10.0  # a process of the test's still ending (torchrun's workers after it) may take this long


def _started_by(nodeid: str) -> list:
    """Live processes other than this one started while `nodeid` ran: each inherits PYTEST_CURRENT_TEST, whatever
    became of its parent (torchrun starts each worker in a session of its own: killing torchrun's session, or
    torchrun itself, leaves them running, reparented to init, where children() no longer finds them)."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid"]):
        if process.pid == os.getpid():
            continue
        try:
            current = process.environ().get("PYTEST_CURRENT_TEST", "")
            if current.rsplit(" (", 1)[0] == nodeid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or another user's
    return found


@pytest.fixture(autouse=True)
def no_process_of_a_real_test_left_behind(request):
    """A real test's processes all end with it: those still running LEFT_BEHIND_GRACE_S after it are killed, and the
    test fails naming them (one left a seed-stall rank of a torchrun job behind, alive for its 30-minute timeout)."""
    yield
    if not request.node.get_closest_marker("real"):
        return
    import psutil

    left = _started_by(request.node.nodeid)
    server = zygote.running()
    if server is not None:
        left += server.ranks_alive()  # forked ranks carry the server's environment, not this test's
    if not left:
        return
    _, alive = psutil.wait_procs(left, timeout=LEFT_BEHIND_GRACE_S)
    named = []
    for process in alive:
        try:
            named.append(" ".join(process.cmdline())[:200])
            process.kill()
        except psutil.Error:
            pass
    if named:
        pytest.fail(f"{request.node.nodeid} left processes running (killed now): {named}", pytrace=False)


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    import ddpwatch.session as session_module

    leftover_threads = [t.name for t in threading.enumerate() if t.name.startswith("ddpwatch")]
    assert session_module.current() is None, "a ddpwatch session is still installed"
    assert not leftover_threads, f"ddpwatch threads left running: {leftover_threads}"
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's deprecated module attributes warn when looked at
            patched = [
                name
                for module in (c10d, dist)
                for name, value in list(vars(module).items())
                if isinstance(value, types.FunctionType) and hasattr(value, "__ddpwatch_original__")
            ]
        assert not patched, f"functions left patched: {patched}"
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:
        children = []
    server = zygote.running()
    children = [c for c in children if server is None or c.pid != server.process.pid]  # it lives as long as its worker
    assert not [c for c in children if c.is_running() and c.status() != "zombie"], f"child processes left: {children}"
