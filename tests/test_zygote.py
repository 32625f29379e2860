"""The suite's rank fork server (tests/zygote.py) starts a rank as `python script.py` would, or does not fork it."""

import json
import os
import subprocess
import sys

import pytest

import zygote
from ranks import SCENARIOS

from ddpwatch.launch import run_ranks

pytestmark = [pytest.mark.real, pytest.mark.timeout(120)]
PROBE = os.path.join(SCENARIOS, "start_probe.py")


def probe(start, tmp_path, *args, **extra_env):
    env = zygote.Server.server_env()
    env.update(PROBE="seen", **extra_env)
    return run_ranks([sys.executable, PROBE, *args], 2, env=env, timeout=60, cwd=str(tmp_path), start=start)


def observed(result) -> dict:
    [line] = [line for line in result.stdout.splitlines() if line.startswith("FACTS ")]
    return json.loads(line[len("FACTS ") :])


def forked(tmp_path, *args, **extra_env):
    """The probe's ranks through the server, checked to have been forked (not exec'd) by it."""
    server = zygote.Server()
    try:
        started = []

        def start(command, **kwargs):
            started.append(server.can_fork(command, kwargs["env"]))
            return zygote.start_with(server, command, **kwargs)

        return probe(start, tmp_path, *args, **extra_env), started
    finally:
        server.close()


@pytest.mark.parametrize("how, code", [("exit", "3"), ("raise", "0"), ("signal", "0")])
def test_a_forked_rank_sees_argv_path_env_cwd_streams_and_exits_as_an_execd_one(tmp_path, how, code):
    plain = probe(subprocess.Popen, tmp_path, code, how)
    results, started = forked(tmp_path, code, how)
    assert started == [True, True]
    assert [r.returncode for r in results] == [r.returncode for r in plain], (results, plain)
    for fork, execd in zip(results, plain):
        assert observed(fork) == observed(execd)
        assert fork.stdout.replace(" ", "") == execd.stdout.replace(" ", "")  # atexit, threads, the flushed buffer
        assert fork.stderr.count("RuntimeError: probe raised") == execd.stderr.count("RuntimeError: probe raised")
    if how == "signal":
        assert results[1].returncode == -9


def test_what_the_interpreter_decides_at_start_up_is_never_forked(tmp_path):
    server = zygote.Server()
    try:
        env = zygote.Server.server_env()
        command = [sys.executable, PROBE, "0"]
        assert server.can_fork(command, env)
        assert not server.can_fork(command, dict(env, DDPWATCH="1"))  # the site hook runs at start-up
        assert not server.can_fork(command, dict(env, PYTHONPATH="/elsewhere"))
        assert not server.can_fork(command, dict(env, OMP_NUM_THREADS="4"))
        assert not server.can_fork(command, dict(env, TORCH_CPP_LOG_LEVEL="INFO"))
        assert not server.can_fork([sys.executable, "-m", "torch.distributed.run", PROBE], env)
        assert not server.can_fork(["/usr/bin/python3.9", PROBE], env)
        with_setting = dict(env)
        with_setting.pop("PYTHONUNBUFFERED")
        assert not server.can_fork(command, with_setting)
    finally:
        server.close()


def test_a_server_that_died_is_replaced_and_the_rank_still_starts(tmp_path):
    first = zygote.server()
    first.process.kill()
    first.process.wait()
    results = probe(zygote.start, tmp_path, "0")  # starts a new server, whose forks run the probe
    assert [r.returncode for r in results] == [0, 0], results
    second = zygote.server()
    assert second is not first and second.process.poll() is None
    assert all(observed(r)["probe"] == "seen" for r in results)
