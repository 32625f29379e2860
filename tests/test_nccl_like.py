"""The fakenccl test backend (tests/nccl_like.py) behaves like NCCL from the host's side, on real gloo-host ranks."""

import json
import os

import pytest

from ranks import SCENARIOS, describe, run_case

PROBES = os.path.join(SCENARIOS, "fakenccl.py")
pytestmark = [pytest.mark.timeout(90), pytest.mark.real]  # every test starts gloo ranks


def facts_of(result):
    lines = [line for line in result.stdout.splitlines() if line.startswith("FACTS ")]
    assert len(lines) == 1, result.stdout + result.stderr[-3000:]
    return json.loads(lines[0][len("FACTS ") :])


def test_calls_return_before_the_op_completes_and_synchronize_waits_for_it(tmp_path):
    results = run_case([PROBES, "returns_before_done"], 2, tmp_path, timeout=60)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    early = facts_of(results[0])
    # Rank 1 joins 3 s late: a call that waited for it would take seconds, one that returns at once takes ms.
    assert early["sync_call_s"] < 1.5 and early["returned_s"] < 1.5, early
    assert early["completed_after_wait"] is False
    assert early["synchronized_s"] > 1.5, early
    assert early["completed_after_sync"] is True
    assert early["values"] == [6.0, 6.0, 6.0]  # 1 + 2, then 3 + 3: both ops ran, in order, with rank 1's values
    assert facts_of(results[1])["values"] == [6.0, 6.0, 6.0]


def test_ddp_trains_through_it_and_the_ranks_agree(tmp_path):
    results = run_case([PROBES, "ddp_trains"], 2, tmp_path, timeout=60)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    zero, one = facts_of(results[0]), facts_of(results[1])
    assert zero["moved"] and zero["ranks_equal"] and one["ranks_equal"]
    assert zero["params"] == one["params"]
    # DDP's own traffic went through fakenccl: the parameter check (allgather), the initial and buffer broadcasts,
    # and the gradient all-reduce of each of the three steps.
    issued = zero["issued"]
    assert issued.get("allreduce", 0) >= 3 and issued.get("broadcast", 0) >= 2 and issued.get("allgather", 0) >= 2


def test_a_collective_on_one_rank_leaves_its_thread_free_until_synchronize_where_it_blocks(tmp_path):
    blocked = tmp_path / "blocked"
    results = run_case(
        [PROBES, "lone_collective"], 2, tmp_path, timeout=60, stop_when=blocked.exists, FAKENCCL_BLOCKED_FILE=blocked
    )
    assert blocked.exists(), describe(results)
    lone = facts_of(results[0])
    assert lone["returned_s"] < 1.5 and lone["steps"] == 100000
    assert lone["completed"] is False
    assert lone["in_synchronize"] and lone["innermost"] == "wait", lone
    assert "synchronize_returned" not in results[0].stdout
