"""Culprits from rank conditions, library frames and skip-vs-uneven, on hand-built traces (no torch)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from factory import rank_state, rec, states, training_history  # noqa: E402

from ddpwatch.static import rankcond  # noqa: E402
from ddpwatch.analysis import DEADLOCK, assess  # noqa: E402
from ddpwatch.render.wording import describe_op, worded  # noqa: E402

GRACE, TIMEOUT_S = 2.0, 300.0
LIGHTNING_BARRIER = {
    "file": "/venv/site-packages/lightning/pytorch/strategies/ddp.py",
    "line": 303,
    "function": "DDPStrategy.barrier",
    "package": "lightning",
}
ACCELERATE_WAIT = {
    "file": "/venv/site-packages/accelerate/accelerator.py",
    "line": 2900,
    "function": "Accelerator.wait_for_everyone",
    "package": "accelerate",
}


def under(text, line=40, file="/u/train.py", kind="if"):
    return {
        "frame": {"file": file, "line": line + 1, "function": "f"},
        "condition": {"line": line, "text": text, "kind": kind},
    }


def run(st):
    return assess(st, len(st), GRACE, TIMEOUT_S)


def only(assessment):
    assert assessment.verdict == DEADLOCK, assessment
    assert len(assessment.findings) == 1, assessment.findings
    return worded(assessment.findings[0])  # with its summary and fix, as report.json has it


def test_a_lone_barrier_under_a_rank_condition_is_the_culprit_not_the_innocent():
    # Lightning: rank 0 calls strategy.barrier() under `if trainer.is_global_zero:`; rank 1 went on training.
    barrier = rec(7, "barrier", site=("callbacks.py", 41, "on_validation_end"))
    barrier["via"] = LIGHTNING_BARRIER
    step = rec(7, "broadcast", api="_broadcast_coalesced", site=("train.py", 80, "training_step"))
    r0 = rank_state(0, 2, inflight=[barrier])
    r0["rank_condition"] = under("if trainer.is_global_zero:", file="/u/callbacks.py")
    st = states(r0, rank_state(1, 2, inflight=[step]))
    f = only(run(st))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("collective_on_subset", [0], 41)
    assert f["evidence"]["culprit_rule"] == "rank_condition"
    assert "trainer.strategy.barrier()" in f["fix"] and "if trainer.is_global_zero:" in f["fix"]
    assert "via DDPStrategy.barrier (lightning)" in f["summary"]


def test_without_a_rank_condition_the_lone_barrier_rule_still_applies():
    barrier = rec(7, "barrier", site=("train.py", 41, "f"))
    other = rec(7, "all_reduce", site=("train.py", 50, "f"))
    f = only(run(states(rank_state(0, 2, inflight=[barrier]), rank_state(1, 2, inflight=[other]))))
    assert (f["ranks"], f["evidence"]["culprit_rule"]) == ([1], "barrier")


def test_conditions_on_both_sides_fall_back_to_the_other_rules():
    barrier = rec(7, "barrier", site=("train.py", 41, "f"))
    other = rec(7, "all_reduce", site=("train.py", 50, "f"))
    r0, r1 = rank_state(0, 2, inflight=[barrier]), rank_state(1, 2, inflight=[other])
    r0["rank_condition"] = under("if rank == 0:")
    r1["rank_condition"] = under("else:", kind="else")
    f = only(run(states(r0, r1)))
    assert f["evidence"]["culprit_rule"] == "barrier"


def test_three_ranks_two_under_a_condition_beat_the_majority_rule():
    wait = rec(5, "barrier", site=("train.py", 12, "f"))
    wait["via"] = ACCELERATE_WAIT
    free = rec(5, "all_reduce", site=("train.py", 30, "f"))
    r1, r2 = rank_state(1, 3, inflight=[dict(wait)]), rank_state(2, 3, inflight=[dict(wait)])
    r1["rank_condition"] = r2["rank_condition"] = under("if not accelerator.is_main_process:")
    f = only(run(states(rank_state(0, 3, inflight=[free]), r1, r2)))
    assert (f["kind"], f["ranks"]) == ("collective_on_subset", [1, 2])
    assert "accelerator.wait_for_everyone()" in f["fix"]


def test_waiting_under_a_rank_condition_while_the_others_exited_blames_the_waiters():
    barrier = rec(9, "barrier", site=("train.py", 41, "f"))
    r0 = rank_state(0, 2, inflight=[barrier])
    r0["rank_condition"] = under("if rank == 0:")
    f = only(run(states(r0, rank_state(1, 2, status="exited"))))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("collective_on_subset", [0], 41)


def test_waiting_without_condition_while_a_rank_exited_still_blames_the_exited_rank():
    barrier = rec(9, "barrier", site=("train.py", 41, "f"))
    f = only(run(states(rank_state(0, 2, inflight=[barrier]), rank_state(1, 2, status="exited"))))
    assert (f["kind"], f["ranks"]) == ("skipped_collective", [1])


def test_a_skip_after_a_matched_checkpoint_barrier_is_skipped_collective_not_uneven_inputs():
    # every rank ran 6 steps and matched the checkpoint barrier (seq 10); rank 1 then skipped the next barrier
    # and is in the next epoch's first step
    next_barrier = rec(11, "barrier", site=("train.py", 33, "train"))
    step = rec(11, "all_reduce", api="DDP.backward_all_reduce", site=("train.py", 20, "train"))
    r0 = rank_state(0, 2, inflight=[next_barrier], recent=training_history(10, True))
    r1 = rank_state(1, 2, inflight=[step], recent=training_history(10, True))
    f = only(run(states(r0, r1)))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("skipped_collective", [1], 33)
    assert f["evidence"]["culprit_rule"] == "left_loop_together"


def test_one_extra_training_step_straight_after_the_last_common_step_is_uneven_inputs():
    barrier = rec(10, "barrier", site=("train.py", 33, "train"))
    step = rec(10, "all_reduce", api="DDP.backward_all_reduce", site=("train.py", 20, "train"))
    r0 = rank_state(0, 2, inflight=[step], recent=training_history(10, False))
    r1 = rank_state(1, 2, inflight=[barrier], recent=training_history(10, False))
    f = only(run(states(r0, r1)))
    assert (f["kind"], f["ranks"]) == ("uneven_inputs", [0])


def test_describe_op_names_the_library_call():
    record = rec(3, "barrier", site=("cb.py", 5, "hook"))
    record["via"] = LIGHTNING_BARRIER
    assert describe_op(record) == "barrier via DDPStrategy.barrier (lightning) at cb.py:5"


def test_rank_only_decorators_are_rank_conditions():
    source = (
        "from lightning.pytorch.utilities import rank_zero_only\n"
        "@rank_zero_only\n"
        "def save(trainer):\n"
        "    trainer.strategy.barrier()\n"
        "class Loop:\n"
        "    @accelerator.on_main_process\n"
        "    def report(self):\n"
        "        accelerator.gather(1)\n"
        "    @functools.cache\n"
        "    def plain(self):\n"
        "        accelerator.gather(1)\n"
    )
    assert rankcond.rank_condition_at(source, 4) == {"line": 2, "kind": "decorator", "text": "@rank_zero_only"}
    assert rankcond.rank_condition_at(source, 8)["text"] == "@accelerator.on_main_process"
    assert rankcond.rank_condition_at(source, 11) is None


def test_a_rank_standing_after_a_rank_guarded_continue_is_innocent_the_rank_elsewhere_took_it():
    # rank 0 waits at the barrier after `if rank == 1 and epoch == 0: continue`; rank 1 runs the next step
    barrier = rec(8, "barrier", site=("train.py", 33, "train"))
    step = rec(8, "all_reduce", api="DDP.backward_all_reduce", site=("train.py", 20, "train"))
    r0 = rank_state(0, 2, inflight=[barrier])
    r0["rank_condition"] = under("if rank == 1 and epoch == 0:", line=31, kind="early_exit")
    r0["rank_condition"]["condition"]["exit_line"] = 32
    f = only(run(states(r0, rank_state(1, 2, inflight=[step]))))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("skipped_collective", [1], 33)
    assert f["evidence"]["culprit_rule"] == "early_exit"
    assert "line 32" in f["fix"] and "if rank == 1 and epoch == 0:" in f["fix"]
