"""A verdict read from the store is a claim (issue 18 point 4): a rank acts on it only if it matches what it sees."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from factory import barrier, rank_state, seed_states, states  # noqa: E402

from ddpwatch.watch import verdict  # noqa: E402

GRACE, TIMEOUT = 2.0, 300.0


def posted(states_seen, world_size=2):
    return {"action": "abort", "positions": verdict.ranges_by_position(states_seen, world_size, GRACE)}


def test_positions_group_ranks_by_where_they_block_in_ranges():
    seen = seed_states(world_size=5)
    table = verdict.ranges_by_position(seen, 5, GRACE)
    assert sorted(table) == sorted({verdict.position_key(seen[0], GRACE), verdict.position_key(seen[1], GRACE)})
    assert table[verdict.position_key(seen[1], GRACE)] == [[1, 4]]
    # unseen ranks: not waiting
    assert verdict.ranges_by_position({0: seen[0]}, 3, GRACE)[verdict.NOT_WAITING] == [[1, 2]]


def test_a_rank_blocked_where_the_verdict_says_acts_on_it():
    seen = seed_states()
    for rank in (0, 1):
        assert verdict.why_not_act(posted(seen), "abort", seen[rank], rank, GRACE, TIMEOUT) is None


def test_a_rank_configured_report_never_acts_whatever_the_verdict():
    seen = seed_states()
    why = verdict.why_not_act(posted(seen), "report", seen[1], 1, GRACE, TIMEOUT)
    assert "action=report" in why


def test_a_rank_elsewhere_than_the_verdict_says_does_not_act():
    seen = seed_states()
    moved = rank_state(1, 2, inflight=[barrier(seq=9, age=5.0)], idle=5.0)
    assert "sees itself at" in verdict.why_not_act(posted(seen), "abort", moved, 1, GRACE, TIMEOUT)
    running = rank_state(1, 2, idle=0.1)  # not in a collective at all
    assert "sees itself at -" in verdict.why_not_act(posted(seen), "abort", running, 1, GRACE, TIMEOUT)


def test_a_rank_the_verdict_saw_outside_collectives_acts_only_once_idle_for_the_timeout():
    busy = rank_state(0, 2, idle=10.0)
    waiting = rank_state(1, 2, inflight=[barrier(age=10.0)], idle=10.0)
    claim = posted(states(busy, waiting))
    assert claim["positions"][verdict.NOT_WAITING] == [[0, 0]]
    assert "no straggler" in verdict.why_not_act(claim, "abort", busy, 0, GRACE, TIMEOUT)
    assert verdict.why_not_act(claim, "abort", dict(busy, idle_s=TIMEOUT + 1), 0, GRACE, TIMEOUT) is None


def test_a_verdict_in_a_shape_not_ours_names_no_position():
    seen = seed_states()
    for table in (
        None,
        [],
        {"0/5": "0-1"},
        {"0/5": [[0, "1"]]},
        {"0/5": [[True, 1]]},
        {5: [[0, 1]]},
        {"0/5": [[0, 1, 2]]},
    ):
        why = verdict.why_not_act({"positions": table, "action": "abort"}, "abort", seen[1], 1, GRACE, TIMEOUT)
        assert why == "the verdict does not say where this rank stands", table
