"""The suite's own pytest settings (setup.cfg): a worker that dies ends the run, naming its test, instead of hanging."""

import os
import signal
import subprocess
import sys

import pytest

from ranks import ROOT

pytestmark = pytest.mark.real  # runs pytest in a process of its own

CRASHING = """
import os, time

def test_before():
    time.sleep(0.5)

def test_dies():
    os._exit(1)  # what an abort in C, a stray signal or os._exit does to an xdist worker

def test_after():
    time.sleep(0.5)
"""


@pytest.mark.timeout(120)
def test_a_worker_that_dies_fails_the_run_naming_its_test_under_readmes_command(tmp_path):
    """README's test command (3 workers, loadgroup) with setup.cfg's settings, on a file whose test kills its worker:
    with xdist's default (replace the worker) this hung for good (seen once in a loaded run, and with this file)."""
    (tmp_path / "test_crash.py").write_text(CRASHING)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist", "loadgroup", "-c", os.path.join(ROOT, "setup.cfg")]
        + ["--rootdir", str(tmp_path), "-p", "no:randomly", str(tmp_path / "test_crash.py")],
        cwd=str(tmp_path),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("the run with a dead worker did not end within 90 s (a hung suite)\n" + out[-3000:])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    assert proc.returncode == 1, out[-3000:]
    assert "crashed while running" in out and "test_crash.py::test_dies" in out, out[-3000:]
