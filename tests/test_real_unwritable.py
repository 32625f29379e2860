"""Nowhere to write (issue 18 point 2): the verdict still reaches stderr in the usual time, abort still ends the job."""

import time

import pytest

from ranks import describe, hang_formed_at, reports, run_case

import ddpwatch.examples.seed_stall as seed

pytestmark = pytest.mark.timeout(150)

# Every file the ranks write is limited to 8 KiB (prlimit --fsize=8192): report.json and every fallback fail (EFBIG).
SMALL_FILES = (
    "import os, resource, sys\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))\n"
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])\n"
)


def test_with_no_file_writable_the_verdict_is_on_stderr_and_abort_ends_every_rank(tmp_path):
    # Before: a chained traceback ("watchdog error, continuing"), no verdict, and the job hung until killed.
    results = run_case(["-c", SMALL_FILES, seed.__file__, "--mark"], 2, tmp_path, timeout=90, DDPWATCH_ACTION="abort")
    ended = time.time()
    assert [r.returncode for r in results] == [3, 3], describe(results)
    writer = next(r for r in results if "[ddp_forward_on_subset] culprit: rank 0" in r.stderr)
    assert "could not write the report anywhere" in writer.stderr, describe(results)
    assert "Traceback" not in writer.stderr, describe(results)
    assert reports(tmp_path) == []
    formed = hang_formed_at(results)
    assert formed is not None and ended - formed < 15.0, (formed, ended)  # a verdict in seconds, not a hang
