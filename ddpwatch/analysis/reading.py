"""Reading rank states: what a rank waits in, where it stands, where it has been, and who waits with whom."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

from ..catalogue import ROOTED, SIZES_PER_RANK
from ..format import build

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import RankState, RecordDoc, Site


class Partition(NamedTuple):
    """Ranks waiting in the same call (same position, op, line, region and tensors), and that call's record."""

    ranks: list
    record: RecordDoc


# ---------------------------------------------------------------- reading one rank's state


def waits_in(record: Mapping[str, Any]) -> bool:
    """Whether the rank waits in this op: it is inside the call, or a thread waits on the op's handle now (in
    Work.wait(), or wait_tensor() on a functional collective's output). A call that returned with its op pending
    (async_op=True, a functional collective, isend/irecv) is not waited in until then: the rank runs its own code
    meanwhile (it overlaps the op with computation, or with calls on other groups), so no proof may count it as
    blocked there, however long the op stays in flight."""
    return not record.get("async") or bool(record.get("waited"))


def waiting_record(state: RankState) -> RecordDoc | None:
    """The op this rank waits on: its oldest collective in flight that it waits in (waits_in); where it waits in
    none (every op in flight returned to it unwaited), its oldest collective in flight all the same, since ranks
    at one position in different calls can never match whether anyone waits on them. Point-to-point only when
    no collective is in flight."""
    inflight = state.get("inflight") or []
    if len(inflight) == 1:
        return inflight[0]  # the usual case, read several times per rank per verdict: no list to build
    collectives = [r for r in inflight if not r.get("p2p")] or inflight
    pool = [r for r in collectives if waits_in(r)] or collectives
    return max(pool, key=lambda r: r.get("age_s", 0.0)) if pool else None


def is_blocked(state: RankState, grace: float) -> bool:
    """In a collective for at least `grace` seconds, with no op started or finished meanwhile."""
    record = waiting_record(state)
    return (
        record is not None
        and record.get("age_s", 0.0) >= grace
        and state.get("idle_s", 0.0) >= grace
        and state.get("status") != build.EXITED
    )


def blocked_records(states: dict[int, RankState], grace: float) -> dict[int, RecordDoc]:
    """{rank: the record it waits in} of the ranks blocked for at least `grace` seconds (is_blocked)."""
    found = {}
    for rank, state in states.items():
        record = waiting_record(state)
        if record is not None and is_blocked(state, grace):
            found[rank] = record
    return found


def waited_s(state: RankState) -> float:
    """How long the rank has waited in the record it waits in (0.0: it waits in none)."""
    record = waiting_record(state)
    return 0.0 if record is None else record.get("age_s", 0.0)


def user_line_now(state: RankState) -> Site | None:
    """Where the rank's main thread stands now in the user's code (innermost non-internal frame), if stacks came."""
    for stack in state.get("stacks") or ():
        if stack.get("main"):
            for frame in reversed(stack.get("frames") or ()):
                if not frame.get("internal"):
                    return build.site(frame["file"], frame["line"], frame["function"])
    return None


def user_location(record: Mapping[str, Any]) -> Site | None:
    """The user's line that made this call: the DDP/object-collective call site when inside one, else its own site."""
    region = record.get("region")
    if region and region.get("site"):
        return region["site"]
    return record.get("site")


def rank_condition(state: dict | None) -> dict | None:
    """The rank condition (if-branch, early exit, rank-only decorator) the rank's own code stands under, if any."""
    found = (state or {}).get("rank_condition")
    return found if isinstance(found, dict) and isinstance(found.get("condition"), dict) else None


def condition_kind(state: dict | None) -> str | None:
    found = rank_condition(state)
    return found["condition"].get("kind") if found else None


def record_at(state: dict, group: str, seq: int) -> dict | None:
    for record in list(state.get("recent") or ()) + list(state.get("inflight") or ()):
        if record.get("group") == group and record.get("seq") == seq and not record.get("p2p"):
            return record
    return None


def completed_at(state: dict, group: str, seq: int) -> dict | None:
    for record in state.get("recent") or ():
        if (
            record.get("group") == group
            and record.get("seq") == seq
            and not record.get("p2p")
            and record.get("state") == build.COMPLETED
        ):
            return record
    return None


def matched_elsewhere(waiting: dict, states: dict) -> set:
    """The ranks of `waiting` ({rank: the record it waits in}) whose call some rank of `states` completed: the same
    group and position, the same unrooted op and tensors. Such an op completes on one rank only once every rank of
    its group has joined it, so that call matched and will return: the rank is late inside it (a first functional
    collective imports for seconds after issuing its op, seen beside a CPU hog), not stuck, and no proof may count it
    blocked. Observed in the run (the peer's own record), not inferred; a rooted call is left out, since its records
    carry no root to say whether the two roles matched."""
    found: set = set()
    if not any(state.get("recent") for state in states.values()):
        return found  # positions (the leader's look) carry no history: only the answers' whole states can show it
    answers: dict = {}  # (group, seq, op, tensors) -> whether some rank completed it: one scan per position
    for rank, record in waiting.items():
        if record.get("p2p") or record["op"] in ROOTED:
            continue
        call = (record["group"], record["seq"], record["op"], shape_key(record))
        if call not in answers:  # a rank waiting in a call has not completed it: no need to leave it out
            answers[call] = any(_completed_call(state, call) for state in states.values())
        if answers[call]:
            found.add(rank)
    return found


def _completed_call(state: dict, call: tuple) -> bool:
    """Whether this rank's recent records hold `call` completed (completed_at, then the op and tensors)."""
    group, seq, op, tensors = call
    done = completed_at(state, group, seq)
    return done is not None and done.get("op") == op and shape_key(done) == tensors


# ---------------------------------------------------------------- history: has a rank been at this line before?


def _same_line(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    return bool(a and b and a.get("file") == b.get("file") and a.get("line") == b.get("line"))


def has_been_at(state: dict, site: Site | None) -> bool:
    """Whether this rank issued a collective from this line before (site counts, else its recent records)."""
    if not site:
        return False
    counts = state.get("site_counts") or {}
    if counts.get(f"{site['file']}:{site['line']}", 0) > _inflight_count_at(state, site):
        return True
    for record in state.get("recent") or ():
        if _same_line(record.get("site"), site) or _same_line((record.get("region") or {}).get("site"), site):
            return True
    return False


def _inflight_count_at(state: dict, site: Site) -> int:
    """Site counts include the call in flight now; "been here before" must not count it."""
    return sum(1 for r in state.get("inflight") or () if _same_line(r.get("site"), site))


def familiar_to(site: Site | None, states: dict, ranks) -> bool:
    return bool(ranks) and all(has_been_at(states[rank], site) for rank in ranks)


# ---------------------------------------------------------------- splitting the waiting ranks


def partitions(waiting: dict) -> list:
    """Ranks waiting on one group split by what they wait in: one Partition per distinct call."""
    parts: dict = {}
    for rank, record in sorted(waiting.items()):
        region = record.get("region") or {}
        key = (
            record["seq"],
            record.get("api"),
            record["op"],
            _site_key(record.get("site")),
            region.get("kind"),
            _site_key(region.get("site")),
            shape_key(record),
        )
        part = parts.get(key)
        if part is None:  # not setdefault: that would build a Partition for every rank of a many-rank hang
            part = parts[key] = Partition([], record)
        part.ranks.append(rank)
    return list(parts.values())


def at_lowest(parts: list, states: dict) -> list:
    """Ranks of one group at different positions, split by what each did at the lowest position any of them waits
    at (the call in flight, or the one it finished there); [] when a rank's record of that position is gone."""
    group = parts[0].record["group"]
    low = min(rec["seq"] for _, rec in parts)
    at_low = {}
    for ranks, rec in parts:
        for rank in ranks:
            at_low[rank] = rec if rec["seq"] == low else record_at(states[rank], group, low)
    known = {r: rec for r, rec in at_low.items() if rec is not None}
    return partitions(known) if len(known) == len(at_low) else []


def _site_key(site: dict | None):
    return (site["file"], site["line"]) if site else None


def shape_key(record: dict):
    """What must agree across ranks in the tensors of one call: shapes and dtypes; dtypes alone where each rank's
    sizes are its own (catalogue.SIZES_PER_RANK: all_to_all's splits, uneven all_gather lists; an object
    collective's payload before padding)."""
    dtypes = tuple(record.get("dtypes") or ())
    if record.get("api") in SIZES_PER_RANK or (record.get("region") or {}).get("kind") == build.OBJECT_COLLECTIVE:
        return ((), dtypes)
    return (tuple(tuple(s) for s in record.get("shapes") or ()), dtypes)


def ranks_of(parts) -> list:
    return sorted(r for ranks, _ in parts for r in ranks)


def waiting_map(states: dict) -> dict:
    return {rank: rec for rank, rec in ((r, waiting_record(s)) for r, s in states.items()) if rec is not None}


def members(states: dict, group: str | None, world_size: int) -> list:
    """The group's ranks as the first state that lists them says (every rank of the job when none does)."""
    ranks = _group_index(states).get(group)
    return list(ranks) if ranks is not None else list(range(world_size))


# (states, their number, {group: its ranks}) of the states asked now (assess() drops it when it returns): the passes
# ask members() once per waiting rank or op, and a scan of every state per ask made one look at 16,384 ranks in 2,048
# groups of 8 take 13-18 s (benchmarks.look_parts, 0b343e9)
_INDEX: tuple = (None, 0, {})


def forget_groups() -> None:
    """Drop the index members() keeps (and the states it holds)."""
    global _INDEX
    _INDEX = (None, 0, {})


def _group_index(states: dict) -> dict:
    global _INDEX
    seen, size, index = _INDEX
    if seen is states and size == len(states):
        return index
    index = {}
    for state in states.values():
        for group, ranks in (state.get("groups") or {}).items():
            if ranks is not None and group not in index:
                index[group] = ranks
    _INDEX = (states, len(states), index)
    return index


# ---------------------------------------------------------------- the source around the ranks' lines (static/exits.py)


def code_of(states: dict) -> dict:
    """Every rank's reading of the source ("file:line" -> what encloses it): the ranks run the same code. An entry a
    file holds in another shape (the format checks types, not every key) is left out."""
    code: dict = {}
    for state in states.values():
        found = (state or {}).get("code")
        if isinstance(found, dict):
            code.update((key, around) for key, around in found.items() if _usable(around))
    return code


def _usable(around) -> bool:
    """Every key the pass reads is there, with its numbers as numbers."""
    try:
        first, last = around["function"]
        numbers = [first, last]
        for loop in around["loops"]:
            numbers += [loop["line"], loop["end"]] + [e["line"] for e in loop["exits"] if e["kind"]]
            numbers += [e["handler"]["line"] for e in loop["exits"] if e.get("handler")]
            numbers += [e["decided_in"]["line"] for e in loop["exits"] if e.get("decided_in")]
        for block in around["tries"]:
            numbers += [block["line"], block["body_end"]] + [h["line"] for h in block["handlers"] if h["then"]]
            numbers += [h["end"] for h in block["handlers"] if "end" in h]
        numbers += [e["line"] for e in around.get("returns") or () if e["kind"]]
        return all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)
    except (KeyError, TypeError, ValueError):
        return False
