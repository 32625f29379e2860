"""Where every rank stands, STAT-style: ranks grouped by the call or line they are at, largest group first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..format import build
from ..analysis.reading import user_line_now, waiting_record
from .wording import describe_op

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import RankState, Site


def _position_key(state: RankState, grace: float) -> tuple:
    if state.get("status") == build.EXITED:
        return ("exited",)
    if state.get("stale"):
        here = user_line_now(state)
        return ("silent", here and (here["file"], here["line"], here["function"]))
    record = waiting_record(state)
    if record is None or record.get("age_s", 0.0) < grace:
        here = user_line_now(state)
        return ("busy", here and (here["file"], here["line"], here["function"]))
    region = record.get("region")
    return (
        "waiting",
        record["group"],
        record["seq"],
        record.get("api"),
        record["op"],
        *_file_and_line(record.get("site")),
        region.get("kind") if region else None,
        *_file_and_line(region.get("site") if region else None),
    )


def _file_and_line(site: Site | None) -> tuple:
    return (site.get("file"), site.get("line")) if site else (None, None)


def _wait_s(state: RankState) -> float:
    record = waiting_record(state)
    return 0.0 if record is None else record.get("age_s", 0.0)


def groups_by_position(states: dict[int, RankState], grace: float) -> list:
    """Ranks grouped by where they stand, largest group first: [{ranks, state, where, wait_s, record}]."""
    groups: dict = {}
    for rank in sorted(states):
        key = _position_key(states[rank], grace)
        groups.setdefault(key, []).append(rank)
    out = []
    for key, ranks in groups.items():
        first = states[ranks[0]]
        record = waiting_record(first) if key[0] == "waiting" else None
        if record is not None:  # "waiting": every rank of the group waits in this call
            waits = [_wait_s(states[r]) for r in ranks]
            where = describe_op(record)
        elif key[0] == "busy":
            waits = [states[r].get("idle_s", 0.0) for r in ranks]
            here = user_line_now(first)
            where = "busy outside collectives" + (f" at {build.short_site(here)}" if here else "")
        elif key[0] == "silent":
            here = user_line_now(first)
            waits = [0.0]
            where = "silent: no answer" + (f" (last seen at {build.short_site(here)})" if here else "")
        else:
            waits, where = [0.0], "exited"
        out.append({"ranks": ranks, "state": key[0], "where": where, "wait_s": round(max(waits), 1), "record": record})
    out.sort(key=lambda g: (-len(g["ranks"]), g["ranks"][0]))
    return out
