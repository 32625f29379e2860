"""What a rank checks before it acts on a verdict read from the store: its own action, and its own position.

The c10d store is unauthenticated: anyone who can reach its port can write a verdict. So a verdict read there is
a claim, not an order. A rank acts on it only when its own configuration says action=abort, and only when the
verdict's view of this rank is what this rank sees of itself: blocked in the collective the verdict names, or, for
a rank the verdict saw outside any collective (a straggler), no collective started or finished here for at least
`timeout`, as a real straggler verdict requires. What that leaves an attacker is in docs/reliability.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import analysis
from ..config import action_row

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import RankState

NOT_WAITING = "-"  # the position of a rank the leader saw outside any collective (busy, silent, not yet there)


def position_key(state: RankState | None, grace: float) -> str:
    """ "group/seq/api" of the collective a rank is blocked in, or NOT_WAITING."""
    if not state:
        return NOT_WAITING
    record = analysis.waiting_record(state)
    if record is None or not analysis.is_blocked(state, grace):  # blocked: in a collective, so record is set
        return NOT_WAITING
    return f"{record.get('group')}/{record.get('seq')}/{record.get('api')}"


def _ranges(ranks: list) -> list:
    """[0, 1, 2, 5] -> [[0, 2], [5, 5]]: a 16,384-rank verdict stays a few bytes when ranks stand together."""
    spans: list = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return spans


def ranges_by_position(states: dict, world_size: int, grace: float) -> dict:
    """{position key: [[first rank, last rank], ...]} of every rank, as the leader saw them for its verdict."""
    grouped: dict = {}
    for rank in range(world_size):
        grouped.setdefault(position_key(states.get(rank), grace), []).append(rank)
    return {key: _ranges(ranks) for key, ranks in grouped.items()}


def claimed_position(verdict: dict, rank: int) -> str | None:
    """Where the verdict says `rank` stands, or None when it does not say (or says it in a shape we do not know)."""
    table = verdict.get("positions")
    if not isinstance(table, dict):
        return None
    for key, spans in table.items():
        if not isinstance(key, str) or not isinstance(spans, list):
            continue
        for span in spans:
            if (
                isinstance(span, list)
                and len(span) == 2
                and all(type(x) is int for x in span)
                and span[0] <= rank <= span[1]
            ):
                return key
    return None


def why_not_act(
    verdict: dict, own_action: str, own_state: RankState, rank: int, grace: float, timeout: float
) -> str | None:
    """None when this rank may act on an abort verdict; else one line saying why it does not."""
    if not action_row(own_action).ends_rank:
        return f"this rank is configured action={own_action}; a peer's verdict never upgrades that to abort"
    if verdict.get("action") != own_action:
        return f"the verdict was carried out as action={verdict.get('action')!s:.40}: a reading, reported only"
    if "mismatch" in verdict:
        return "collectives that completed without matching are a reading: reported, never acted on"
    claimed = claimed_position(verdict, rank)
    if claimed is None:
        return "the verdict does not say where this rank stands"
    mine = position_key(own_state, grace)
    if claimed != mine:
        return f"it places this rank at {claimed}, but this rank sees itself at {mine}"
    if mine == NOT_WAITING and own_state.get("idle_s", 0.0) < timeout:
        return "this rank is outside any collective and was in one less than `timeout` ago: no straggler"
    return None
