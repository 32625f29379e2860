"""Helpers for the real multi-process tests: run a scenario on N gloo ranks with a hard limit, read its report."""

import glob
import json
import os
import re
import sys

import zygote

from ddpwatch.launch import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCENARIOS = os.path.join(HERE, "scenarios")
# py-spy's native stacks cost each incident 1-1.5 s of CPU and pause the ranks it reads: the ranks of a test that
# does not read them leave them off (a test that does passes DDPWATCH_NATIVE_STACKS=1).
NATIVE_OFF = {"DDPWATCH_NATIVE_STACKS": "0"}


def run_case(args, nprocs, report_dir, timeout=90, stop_when=None, **env_overrides):
    env = dict(os.environ)
    env.pop("DDPWATCH", None)
    env.update({"DDPWATCH_DIR": str(report_dir), "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", "")})
    env.update(NATIVE_OFF)
    env.update({k: str(v) for k, v in env_overrides.items()})
    return run_ranks(
        [sys.executable] + list(args), nprocs, env=env, timeout=timeout, stop_when=stop_when, start=zygote.start
    )


def reports(report_dir):
    return sorted(glob.glob(os.path.join(str(report_dir), "*", "report.json")))


def reported_and_exited(report_dir, rank):
    """A `stop_when` for a job one of whose ranks stays alive on purpose (asleep, outside any collective) past the
    verdict: true once a report is written and `rank` (its pid read from the report) has exited."""
    import psutil

    def stop():
        found = reports(report_dir)
        if not found:
            return False
        try:
            with open(found[0]) as handle:
                [pid] = [state["pid"] for state in json.load(handle)["ranks"] if state.get("rank") == rank]
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
        except (OSError, ValueError, KeyError, TypeError):
            return False

    return stop


def load_only_report(report_dir):
    found = reports(report_dir)
    assert len(found) == 1, f"expected exactly one report, found {found}"
    with open(found[0]) as handle:
        return json.load(handle)


def tagged_line(path, tag):
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if f"# LINE:{tag}" in line:
                return number
    raise AssertionError(f"no line tagged {tag} in {path}")


def hang_formed_at(results):
    marks = [float(m) for r in results for m in re.findall(r"DDPWATCH-MARK hang-forms ([0-9.]+)", r.stderr)]
    return max(marks) if marks else None


def describe(results):
    return "\n".join(f"--- rank {r.rank} exit {r.returncode}\n{r.stderr[-3000:]}" for r in results)


def run_torchrun(args, nprocs, report_dir, timeout=90, **env_overrides):
    """`python -m torch.distributed.run` (torchrun: its agent SIGTERMs the other workers once one fails) on `args`,
    in a session of its own, killed whole at the limit: (exit status, its output and its workers', interleaved)."""
    return run_job(*torchrun_job(args, nprocs, report_dir, **env_overrides), None, timeout)


def torchrun_job(args, nprocs, report_dir, **env_overrides):
    """(command, environment) of a torchrun job on `args` with `nprocs` workers on a free port, reports to
    `report_dir`; none of this process's DDPWATCH_*, TORCHELASTIC_*, MASTER_* or rank variables leak in."""
    from ddpwatch.launch import free_port

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DDPWATCH", "TORCHELASTIC", "MASTER_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        or k == "DDPWATCH_RECORDER"  # pytest --recorder: the recorder every test's ranks use
    }
    env.update(
        {
            "DDPWATCH_DIR": str(report_dir),
            "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **NATIVE_OFF,
        }
    )
    env.update({k: str(v) for k, v in env_overrides.items()})
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nprocs),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
    ] + [str(a) for a in args]
    return command, env


def run_job(command, env, cwd, timeout):
    """Run a whole job (torchrun and its workers) in its own session; kill that session whatever happens:
    (exit status, its output and its workers', interleaved)."""
    return finish_job(*start_job(command, env, cwd), timeout)


def start_job(command, env, cwd=None):
    """Start a whole job in a session of its own, its output and its workers' to one temporary file:
    (Popen, that file). finish_job ends it; the caller may act on the job (signal it) in between."""
    import subprocess
    import tempfile

    out = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=None if cwd is None else str(cwd),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, out


def finish_job(proc, out, timeout):
    """Wait for the job at most `timeout` seconds, then kill its whole session whatever happened: (exit status,
    its output)."""
    import subprocess

    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        from ddpwatch.launch import kill_tree

        kill_tree(proc.pid)
        proc.wait()
    with out:
        out.seek(0)
        return proc.returncode, out.read()
