"""docs/contributing.md's "Add a collective" recipe, followed once: one toy row in the catalogue, and patching, lint
and the hot path's signature all pick it up (in a fresh interpreter, so the row is there before anything reads it)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.real  # its one test runs a patched job in a process of its own

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_S = 90

SCRIPT = textwrap.dedent("""
    import datetime, json
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real_all_reduce = c10d.all_reduce  # taken before any patch: the toy's body is a real collective

    def toy_all_reduce(tensor, group=None, async_op=False):
        return real_all_reduce(tensor, group=group, async_op=async_op)

    dist.toy_all_reduce = c10d.toy_all_reduce = toy_all_reduce

    from ddpwatch import catalogue
    catalogue.COLLECTIVES["toy_all_reduce"] = catalogue.Collective("all_reduce", ("tensor",), 1)  # the recipe's row

    import ddpwatch
    from ddpwatch import lint
    from ddpwatch.launch import free_port

    found = lint.lint_source("import torch.distributed as dist\\nif rank == 0:\\n    dist.toy_all_reduce(t)\\n")
    with ddpwatch.guard() as session:
        store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        patched = hasattr(c10d.toy_all_reduce, "__ddpwatch_original__")
        dist.toy_all_reduce(torch.ones(4))
        recent = session.recorder.snapshot(recent=5)["recent"]
        dist.destroy_process_group()
    print(json.dumps({"lint": [f.code for f in found], "patched": patched,
                      "recorded": [(r["op"], r["api"], r["shapes"]) for r in recent]}))
""")


@pytest.mark.timeout(LIMIT_S + 30)
def test_a_collective_added_as_one_catalogue_row_is_patched_recorded_and_linted():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DDPWATCH", None)
    env["DDPWATCH_RECORDER"] = "python"  # the recipe is the per-op wrapper's: the flight recorder patches no collective
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        text=True,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        out, err = "", "still running at the limit"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    import json

    result = json.loads(out.strip().splitlines()[-1])
    assert result["lint"] == ["DDP002"]
    assert result["patched"] is True
    assert result["recorded"][-1] == ["all_reduce", "toy_all_reduce", [[4]]]
