"""Rank conditions in findings (the culprit's line runs only under `if rank == 0:`), from the incident, never a file."""

from __future__ import annotations


def condition_of_rank(rank: int, states: dict, captured: dict) -> dict | None:
    """The rank condition rank `rank` stands under: the one its state carries (the watchdog's, for its wait), else
    the one captured over its stack when the incident was taken ({str(rank): {"frame", "condition"}})."""
    state = states.get(rank)
    return (state.get("rank_condition") or captured.get(str(rank))) if state else None


def add_rank_conditions(findings: list, states: dict, captured: dict | None) -> None:
    """Put the strongest hint to the fix into each finding: the culprit's line sits under a rank condition."""
    captured = captured or {}
    for finding in findings:
        conditions = {}
        for rank in finding.get("ranks") or ():
            found = condition_of_rank(rank, states, captured)
            if found:
                conditions[str(rank)] = found
        if not conditions:
            continue
        finding["evidence"]["rank_condition"] = conditions  # render/wording.py says it at the summary's end
