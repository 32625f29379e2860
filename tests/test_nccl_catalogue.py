"""The hang catalogue on the fakenccl test backend (NCCL's host-side semantics): ddpwatch must give gloo's verdicts."""

import os

import pytest

from ranks import SCENARIOS, describe, load_only_report, reported_and_exited, reports, run_case, tagged_line

CATALOGUE = os.path.join(SCENARIOS, "catalogue.py")
PROBES = os.path.join(SCENARIOS, "fakenccl.py")
ABORT = {"DDPWATCH_ACTION": "abort"}
pytestmark = [pytest.mark.timeout(120), pytest.mark.real]  # every test starts gloo ranks


class Case:
    """One reproduction and the verdict test_real_catalogue.py expects of it on gloo."""

    def __init__(self, name, kind, culprits, lines, ranks=2, env=ABORT, exits=3, host_blocked=()):
        self.name, self.kind, self.culprits, self.lines = name, kind, culprits, lines
        self.ranks, self.env, self.exits = ranks, env, exits
        # Ranks whose collective call returned and whose thread waits later, in the fake's host wait (synchronize()
        # or a barrier queued behind the hung op): the NCCL semantics were in play, not gloo's blocking call.
        self.host_blocked = host_blocked

    def __repr__(self):
        return self.name


CASES = [
    Case("rebuild", "ddp_forward_on_subset", [0], ["rebuild_call"]),
    Case("skipped", "skipped_collective", [1], ["skip_barrier"]),
    Case("uneven", "uneven_inputs", [0], ["uneven_backward"]),
    Case("shape", "shape_mismatch", [1], ["shape_all_reduce"], host_blocked=[0]),
    Case("group_order", "group_order", [0, 1], ["order_first", "order_second"], host_blocked=[0, 1]),
    Case(
        "stuck",
        "collective_stuck",
        [0, 1],
        ["stuck_all_reduce"],
        env=dict(ABORT, DDPWATCH_TIMEOUT=4),
        host_blocked=[0, 1],
    ),
    Case(
        "unresponsive",
        "unresponsive_rank",
        [1],
        ["stopped"],
        env={"DDPWATCH_ACTION": "report", "DDPWATCH_DEAD_AFTER": 4},
        exits=None,
    ),
    Case(
        "dead",
        "dead_rank",
        [1],
        [],
        ranks=3,
        env=dict(ABORT, DDPWATCH_DEAD_AFTER=4),
        exits={0: 3, 1: 1},
        host_blocked=[0],
    ),
]


def run_on_fakenccl(case, report_dir):
    stop_when = (lambda: bool(reports(report_dir))) if case.exits is None else None  # a stopped rank stays hung
    if case.name == "dead":  # rank 2 sleeps 60 s, alive outside collectives: stopped once rank 0 has exited
        stop_when = reported_and_exited(report_dir, 0)
    return run_case(
        [CATALOGUE, case.name],
        case.ranks,
        report_dir,
        timeout=60,
        stop_when=stop_when,
        CATALOGUE_BACKEND="fakenccl",
        **case.env,
    )


def main_thread_functions(incident, rank):
    [state] = [s for s in incident["ranks"] if s["rank"] == rank]
    [main] = [stack for stack in state.get("stacks") or () if stack.get("main")]
    return [frame["function"] for frame in main["frames"]]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_fakenccl_gives_the_gloo_verdict(case, tmp_path):
    results = run_on_fakenccl(case, tmp_path)
    if isinstance(case.exits, int):
        assert all(r.returncode == case.exits for r in results), describe(results)
    elif isinstance(case.exits, dict):
        assert all(results[rank].returncode == code for rank, code in case.exits.items()), describe(results)
    incident = load_only_report(tmp_path)
    assert [(f["kind"], f["ranks"]) for f in incident["findings"]] == [(case.kind, case.culprits)], describe(results)
    if case.lines:
        assert incident["findings"][0]["location"]["line"] in [tagged_line(CATALOGUE, tag) for tag in case.lines]
    for rank in case.host_blocked:
        assert "wait_done" in main_thread_functions(incident, rank), (rank, main_thread_functions(incident, rank))


def test_a_correct_job_whose_rank_waits_in_synchronize_for_a_slow_peer_gives_no_report(tmp_path):
    # Rank 0 sits in synchronize() with an all_reduce in flight for 4 s while rank 1 is busy elsewhere.
    results = run_case([PROBES, "slow_peer_watched"], 2, tmp_path, timeout=60, DDPWATCH_ACTION="abort")
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert all('"watched": true' in r.stdout for r in results), describe(results)
    assert reports(tmp_path) == []
