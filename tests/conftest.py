"""Shared test fixtures: every test must leave no ddpwatch patch, thread or child process behind."""

import os
import sys
import threading
import types
import warnings

import pytest

sys.path.insert(0, os.path.dirname(__file__))


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


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    import ddpwatch.runtime.session as session_module

    leftover_threads = [t.name for t in threading.enumerate() if t.name.startswith("ddpwatch")]
    assert session_module.current() is None, "a ddpwatch session is still installed"
    assert not leftover_threads, f"ddpwatch threads left running: {leftover_threads}"
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's deprecated module attributes warn when looked at
            patched = [name for module in (c10d, dist) for name, value in list(vars(module).items())
                       if isinstance(value, types.FunctionType) and hasattr(value, "__ddpwatch_original__")]
        assert not patched, f"functions left patched: {patched}"
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:
        children = []
    assert not [c for c in children if c.is_running() and c.status() != "zombie"], f"child processes left: {children}"
