"""Issue 12: real Lightning, Accelerate, FSDP2, DTensor and functional-collective hangs, and what a right report says.

Each hang runs on 2 gloo ranks (tests/scenarios/frameworks.py); the report must name the right kind, the culprit
rank, the user's own line (tagged `# LINE:` there, never a site-packages frame) and a fix in the framework's terms.
The benign runs of each framework must give no report. What each case reported before the fixes of issue 12 (the
library of commit c05745e) is in tests/scenarios/frameworks_measured.md.
"""

import importlib.util
import json
import os

import pytest

from ranks import ROOT, SCENARIOS, describe, load_only_report, reports, run_case, tagged_line

from ddpwatch import analysis

FRAMEWORKS = os.path.join(SCENARIOS, "frameworks.py")
pytestmark = pytest.mark.timeout(150)

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning not installed")
needs_accelerate = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate not installed")
needs_fsdp2 = pytest.mark.skipif(
    importlib.util.find_spec("torch.distributed.fsdp._fully_shard") is None,
    reason="torch without FSDP2 (fully_shard, torch >= 2.6)",
)
needs_dtensor = pytest.mark.skipif(
    importlib.util.find_spec("torch.distributed.tensor") is None, reason="torch without public DTensor (torch >= 2.5)"
)


def line(tag):
    return tagged_line(FRAMEWORKS, tag)


def hang_report(case, tmp_path, **env):
    """Run a hanging case with action=report, stop the job once the hang's report lands, return (incident, finding).
    A report of collectives that completed without matching (trigger `mismatch`, a reading that never acts) may come
    first: under load rank 0's collective can complete against a peer's later one before every rank is blocked. It is
    allowed, and must be a reading; the hang's own report is the one checked."""
    report_dir = tmp_path / "reports"
    results = run_case(
        [FRAMEWORKS, case],
        2,
        report_dir,
        timeout=60,
        stop_when=lambda: bool(hang_reports(report_dir)),
        DDPWATCH_ACTION="report",
        DDPWATCH_TIMEOUT=10,
        FRAMEWORKS_ROOT_DIR=str(tmp_path),  # Lightning's folder in the test's own, not a new one in /tmp each run
        **env,
    )
    found = hang_reports(report_dir)
    assert len(found) == 1, f"expected exactly one hang report, found {found}\n" + describe(results)
    incident = loaded(found[0])
    readings = [loaded(path) for path in reports(report_dir) if path not in found]
    # A mismatch incident whose answers came in once the hang had formed is assessed again, and then carries the
    # hang's own proof (one run in about eight under load): that may act, being the same finding; nothing else may.
    hang = [(f["kind"], f["ranks"], f["location"]) for f in incident["findings"]]
    for reading in readings:
        if analysis.findings_act(reading["findings"]):
            assert [(f["kind"], f["ranks"], f["location"]) for f in reading["findings"]] == hang, (reading, incident)
    assert len(incident["findings"]) == 1, (incident["findings"], describe(results))
    return incident, incident["findings"][0]


def loaded(path):
    with open(path) as handle:
        return json.load(handle)


def hang_reports(report_dir):
    """The reports written so far whose trigger is not `mismatch` (one still being written is not yet seen)."""
    found = []
    for path in reports(report_dir):
        try:
            trigger = loaded(path)["trigger"]
        except (OSError, ValueError, KeyError):
            continue
        if trigger != analysis.MISMATCH:
            found.append(path)
    return found


def assert_user_line(finding, tag):
    location = finding["location"]
    assert "site-packages" not in location["file"], location
    assert os.path.basename(location["file"]) == "frameworks.py" and location["line"] == line(tag), location


def assert_rank_condition(finding, rank, words):
    """The condition read around the culprit's own frame: an `if`, an early exit, a decorator (@rank_zero_only)."""
    found = finding["evidence"]["rank_condition"][str(rank)]
    assert os.path.basename(found["frame"]["file"]) == "frameworks.py", found
    assert words in found["condition"]["text"], found


def assert_collective_on_subset(incident, finding, tag, condition_words):
    """Rank 0 alone entered a collective under a rank-0-only condition; rank 1 is innocent."""
    assert incident["trigger"] == "deadlock"  # every rank blocked in calls that cannot match: proven, not a timeout
    assert finding["kind"] == "collective_on_subset"
    assert finding["ranks"] == [0]
    assert_user_line(finding, tag)
    assert_rank_condition(finding, 0, condition_words)


def run_benign(case, tmp_path, **env):
    report_dir = tmp_path / "reports"
    results = run_case(
        [FRAMEWORKS, case],
        2,
        report_dir,
        timeout=90,
        DDPWATCH_ACTION="report",
        # What these check is that no proof fires on correct framework code; a straggler reading after the timeout
        # is right when a rank really stalls that long: 10 s was crossed once beside a CPU hog (rank 1 importing
        # DTensor's modules at its first functional collective, as plain torch does)
        DDPWATCH_TIMEOUT=60,
        FRAMEWORKS_ROOT_DIR=str(tmp_path),
        **env,
    )
    assert all(r.returncode == 0 and "rank finished cleanly" in r.stderr for r in results), describe(results)
    assert reports(report_dir) == [], describe(results)
    return results


# ---------------------------------------------------------------- Lightning


@needs_lightning
def test_lightning_sync_dist_log_on_global_zero_only(tmp_path):
    incident, finding = hang_report("lightning_log_sync_rank0", tmp_path)
    # The reduce runs at validation epoch end, long after self.log returned: the line is not on the stack then.
    assert_collective_on_subset(incident, finding, "log_sync", "is_global_zero")
    assert "val_x" in finding["summary"] and "validation_step" in finding["summary"]
    assert "sync_dist" in finding["fix"] and "rank_zero_only" in finding["fix"]


@needs_lightning
@pytest.mark.parametrize("activation", [{}, {"DDPWATCH": "1"}], ids=["guard", "zero_code"])
def test_lightning_strategy_barrier_in_a_callback_on_global_zero_only(tmp_path, activation):
    incident, finding = hang_report("lightning_barrier_rank0", tmp_path, **activation)
    assert_collective_on_subset(incident, finding, "strategy_barrier", "is_global_zero")
    assert "barrier" in finding["fix"] and "every rank" in finding["fix"]


@needs_lightning
def test_lightning_broadcast_inside_rank_zero_only(tmp_path):
    incident, finding = hang_report("lightning_rank_zero_only", tmp_path)
    assert_collective_on_subset(incident, finding, "rank_zero_broadcast", "rank_zero_only")
    assert "rank_zero_only" in finding["fix"]


@needs_lightning
def test_lightning_fit_with_validation_and_sync_dist_on_every_rank_gives_no_report(tmp_path):
    run_benign("lightning_fit_benign", tmp_path)


# ---------------------------------------------------------------- Accelerate


@needs_accelerate
def test_accelerate_wait_for_everyone_on_main_process_only(tmp_path):
    incident, finding = hang_report("accelerate_wait_rank0", tmp_path)
    assert_collective_on_subset(incident, finding, "wait_for_everyone", "is_main_process")
    assert "wait_for_everyone" in finding["fix"]


@needs_accelerate
def test_accelerate_gather_on_main_process_only(tmp_path):
    incident, finding = hang_report("accelerate_gather_rank0", tmp_path)
    assert_collective_on_subset(incident, finding, "gather", "is_main_process")
    assert "gather" in finding["fix"]


@needs_accelerate
def test_accelerate_reduce_inside_on_main_process(tmp_path):
    incident, finding = hang_report("accelerate_on_main_process", tmp_path)
    assert_collective_on_subset(incident, finding, "on_main_reduce", "on_main_process")
    assert "on_main_process" in finding["fix"]


@needs_accelerate
def test_accelerate_loop_with_gather_for_metrics_on_every_rank_gives_no_report(tmp_path):
    run_benign("accelerate_benign", tmp_path)


# ---------------------------------------------------------------- FSDP2, functional collectives, DTensor


@needs_fsdp2
def test_fsdp2_evaluation_forward_on_rank0_only(tmp_path):
    incident, finding = hang_report("fsdp2_eval_rank0", tmp_path)
    assert_collective_on_subset(incident, finding, "fsdp_eval_forward", "get_rank() == 0")
    assert "every rank" in finding["fix"] and ("FSDP" in finding["fix"] or "fully_shard" in finding["fix"])
    # Only the collective each rank is blocked in: the 2 training steps' reduce-scatters completed long ago.
    assert [len(state["inflight"]) for state in incident["ranks"]] == [1, 1]


@needs_fsdp2
def test_fsdp2_train_and_eval_on_every_rank_gives_no_report_and_no_inflight_growth(tmp_path):
    results = run_benign("fsdp2_benign", tmp_path, FRAMEWORKS_STEPS=200)
    assert all("FRAMEWORKS-INFLIGHT 0\n" in r.stderr for r in results), [r.stderr[-300:] for r in results]


def test_functional_all_reduce_on_rank0_only(tmp_path):
    incident, finding = hang_report("funcol_rank0", tmp_path)
    assert incident["trigger"] == "deadlock"
    assert finding["kind"] == "collective_on_subset" and finding["ranks"] == [0]
    # Issued at one line, waited on (wait_tensor) at the next: either is the user's own line.
    location = finding["location"]
    assert os.path.basename(location["file"]) == "frameworks.py", location
    assert location["line"] in (line("funcol_all_reduce"), line("funcol_use")), location
    assert_rank_condition(finding, 0, "get_rank() == 0")
    assert "every rank" in finding["fix"]


def test_a_collective_python_never_sees_comes_from_the_flight_recorder(tmp_path):
    incident, finding = hang_report("ops_rank0", tmp_path)
    assert incident["trigger"] == "deadlock"
    assert (finding["kind"], finding["ranks"]) == ("collective_on_subset", [0])
    assert_user_line(finding, "ops_wait")
    assert_rank_condition(finding, 0, "get_rank() == 0")
    [side] = [row for row in finding["evidence"]["mismatched"] if row["ranks"] == [0]]
    # The python recorder found it in the Flight Recorder's tail (api "flight_recorder": seen there only); under
    # recorder=flight every record is the Flight Recorder's, the op its own api.
    flight_is_the_record = os.environ.get("DDPWATCH_RECORDER") == "flight"
    assert (side["op"], side["api"]) == ("all_reduce", "all_reduce" if flight_is_the_record else "flight_recorder")


def test_functional_collectives_on_every_rank_give_no_report(tmp_path):
    run_benign("funcol_benign", tmp_path)


@needs_dtensor
def test_dtensor_full_tensor_on_rank0_only(tmp_path):
    incident, finding = hang_report("dtensor_rank0", tmp_path)
    assert_collective_on_subset(incident, finding, "dtensor_full_tensor", "get_rank() == 0")
    assert "full_tensor" in finding["fix"] and "every rank" in finding["fix"]


@needs_dtensor
def test_dtensor_ops_on_every_rank_give_no_report(tmp_path):
    run_benign("dtensor_benign", tmp_path)


# ---------------------------------------------------------------- skip vs uneven (issue 12, point 5)


@pytest.mark.parametrize(
    "case",
    [
        "skip_after_checkpoint",
        "skip_after_checkpoint_backward",
    ],
)
def test_skip_after_a_matched_checkpoint_barrier_is_a_skipped_collective(tmp_path, case):
    incident, finding = hang_report(case, tmp_path)
    assert incident["trigger"] == "deadlock"
    assert finding["kind"] == "skipped_collective"
    assert finding["ranks"] == [1]
    assert_user_line(finding, "skip_ckpt_barrier")
    assert "different numbers of training steps" not in finding["summary"]
    assert "continue" in finding["fix"]


@needs_lightning
def test_abort_under_torchrun_ends_every_rank_quietly_with_the_verdict(tmp_path):
    """action=abort: torchrun SIGTERMs the rank still running once the first exits; after the verdict that rank ends
    with ddpwatch's exit code, and neither Lightning's SIGTERM handler nor failing collectives add to the output."""
    import subprocess
    import sys

    from ddpwatch.launch import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPWATCH")}
    env.update(
        DDPWATCH_DIR=str(tmp_path / "reports"),
        DDPWATCH_ACTION="abort",
        DDPWATCH_TIMEOUT="10",
        FRAMEWORKS_ROOT_DIR=str(tmp_path),
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        FRAMEWORKS,
        "lightning_barrier_rank0",
    ]
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=100)
    finally:
        try:
            os.killpg(proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    assert proc.returncode not in (0, None), output[-4000:]
    incident = load_only_report(tmp_path / "reports")
    assert [f["kind"] for f in incident["findings"]] == ["collective_on_subset"]
    assert output.count("exitcode  : 3") == 2, output[-4000:]  # torchrun's summary: both ranks ended by the verdict
    assert "Received SIGTERM" not in output, output[-4000:]  # Lightning's handler did not run on top of ddpwatch's
    assert "Connection closed by peer" not in output and "RuntimeError" not in output, output[-4000:]
