"""Real multi-process tests on gloo: the seed stall and its relatives, caught (or rightly not) end to end."""

import os

import pytest

from ranks import SCENARIOS, describe, hang_formed_at, load_only_report, reports, run_case, tagged_line

import ddpwatch.examples.seed_stall as seed

SEED = seed.__file__
HANGS = os.path.join(SCENARIOS, "hangs.py")
pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_seed_stall_is_ddp_forward_on_subset_naming_rank0_and_the_line(tmp_path, nprocs):
    results = run_case(["-m", "ddpwatch.examples.seed_stall", "--mark"], nprocs, tmp_path, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    incident = load_only_report(tmp_path)
    [finding] = incident["findings"]
    assert finding["kind"] == "ddp_forward_on_subset"
    assert finding["ranks"] == [0]
    assert finding["location"]["line"] == tagged_line(SEED, "seed_ddp_call")
    assert os.path.samefile(finding["location"]["file"], SEED)
    assert "model.module(" in finding["fix"]
    assert finding["evidence"]["ddp_op"] == "buffer_broadcast"
    waiting = [row for row in finding["evidence"]["mismatched"] if 0 not in row["ranks"]]
    assert waiting[0]["ranks"] == list(range(1, nprocs))
    assert waiting[0]["op"] == "barrier" and waiting[0]["site"]["line"] == tagged_line(SEED, "seed_epoch_barrier")
    formed = hang_formed_at(results)
    assert formed is not None and incident["created_at"] - formed < 5.0, (formed, incident["created_at"])
    assert len(incident["ranks"]) == nprocs and all(state["stacks"] for state in incident["ranks"])
    assert incident["ranks"][0]["stacks"][0]["main"] is True
    folder = os.path.dirname(reports(tmp_path)[0])
    assert set(os.listdir(folder)) >= {"report.txt", "report.json"} | {f"rank-{r}.json" for r in range(nprocs)}
    assert not [name for name in os.listdir(folder) if name.startswith(".")]  # no staging left behind
    # the report reaches the writer's stderr: the last rank to block proves the deadlock, whichever rank that is
    assert any("[ddp_forward_on_subset] culprit: rank 0" in r.stderr for r in results), describe(results)


def test_fixed_seed_loop_finishes_with_no_report(tmp_path):
    results = run_case(["-m", "ddpwatch.examples.seed_stall", "--fixed"], 2, tmp_path, DDPWATCH_ACTION="abort")
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == []


def test_rank0_only_all_reduce_is_collective_on_subset(tmp_path):
    results = run_case([HANGS, "collective_on_subset"], 2, tmp_path, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    [finding] = load_only_report(tmp_path)["findings"]
    assert finding["kind"] == "collective_on_subset"
    assert finding["ranks"] == [0]
    assert finding["location"]["line"] == tagged_line(HANGS, "subset_all_reduce")


def test_busy_rank_shorter_than_timeout_gives_no_report(tmp_path):
    results = run_case([HANGS, "busy:6"], 2, tmp_path, DDPWATCH_TIMEOUT=12, DDPWATCH_ACTION="abort")
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == []


@pytest.mark.parametrize("recorder", ["python", "flight"])
def test_an_async_op_overlapped_with_a_call_on_another_group_ends_no_job(tmp_path, recorder):
    """Rank 0 holds an all_reduce it issued with async_op=True while it computes, then meets rank 1 at a barrier on
    another group: a false group_order under abort before (each rank read as waiting on a group the other was not
    in); now rank 0 is read as waiting in nothing (python: its record says the call returned; flight: no thread of
    it waits inside torch), and both ranks finish."""
    results = run_case(
        [HANGS, "async_overlap"], 2, tmp_path, DDPWATCH_ACTION="abort", DDPWATCH_TIMEOUT=30, DDPWATCH_RECORDER=recorder
    )
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == [], describe(results)


def test_busy_rank_longer_than_timeout_is_a_straggler(tmp_path):
    results = run_case([HANGS, "busy:60"], 2, tmp_path, DDPWATCH_TIMEOUT=4, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    incident = load_only_report(tmp_path)
    assert incident["trigger"] == "timeout"
    [finding] = incident["findings"]
    assert finding["kind"] == "straggler"
    assert finding["ranks"] == [0]
    assert finding["location"]["line"] == tagged_line(HANGS, "busy_loop")


def test_report_action_keeps_waiting_and_reports_once(tmp_path):
    """action=report: the job goes on waiting; one report, not one per watchdog round."""
    # 20 s: start-up (5 s here, 10+ s on a loaded machine) + the verdict + time to see no second report
    results = run_case([HANGS, "collective_on_subset"], 2, tmp_path, timeout=20, DDPWATCH_ACTION="report")
    assert all(r.returncode not in (0, 3) for r in results), describe(results)  # killed at the limit: still hung
    assert len(reports(tmp_path)) == 1
