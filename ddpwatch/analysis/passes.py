"""The passes: one pure function per finding kind (or per family of kinds), each handing over facts, never words."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from ..format import build
from .history import left_with_data
from .reading import (
    Partition,
    at_lowest,
    blocked_records,
    completed_at,
    condition_kind,
    familiar_to,
    is_blocked,
    members,
    partitions,
    rank_condition,
    ranks_of,
    shape_key,
    user_line_now,
    user_location,
    waiting_map,
    waiting_record,
    waits_in,
)

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import RankState


def finding(kind: str, ranks, location: Mapping[str, Any] | None, evidence: dict, /, **facts) -> dict:
    """One finding as data: its kind, culprit ranks, the user's line, its evidence, and the facts its words need.

    render/wording.py turns the facts into the summary and fix that report.json carries (and fills the evidence's
    words, left None here: a mismatched row's description, where a silent rank was last, what culprits do now).
    """
    return {"kind": kind, "ranks": sorted(ranks), "location": location, "evidence": evidence, "facts": facts}


# ---------------------------------------------------------------- which partition is innocent, and by what rule

# Inside one of these, a line runs on some ranks only. After an early exit (`if rank == 1: continue` above it) the
# opposite holds: a rank standing there did not take the exit, so the ranks elsewhere did.
_RANK_ONLY_REGIONS = ("if", "else", "while", "decorator")
EARLY_EXIT = "early_exit"


def _all_of(ranks, states: dict, kinds) -> bool:
    return bool(ranks) and all(condition_kind(states.get(r)) in kinds for r in ranks)


def _none_of(ranks, states: dict, kinds) -> bool:
    return not any(condition_kind(states.get(r)) in kinds for r in ranks)


def _rank_only_culprits(parts: list, states: dict):
    """The one partition outside any rank-only region while every other stands inside one: the others are culprits."""
    outside = [p for p in parts if _none_of(p.ranks, states, _RANK_ONLY_REGIONS)]
    inside = [p for p in parts if _all_of(p.ranks, states, _RANK_ONLY_REGIONS)]
    if len(outside) == 1 and inside and len(inside) + 1 == len(parts):
        return outside[0]
    return None


def _past_an_early_exit(parts: list, states: dict):
    """The one partition standing after a rank-guarded early exit that the others' code does not stand after."""
    after = [p for p in parts if _all_of(p.ranks, states, (EARLY_EXIT,))]
    if len(after) == 1 and all(_none_of(p.ranks, states, (EARLY_EXIT,)) for p in parts if p is not after[0]):
        return after[0]
    return None


def _innocent_partition(parts: list, states: dict):
    """The partition that waits where the program expects everyone.

    First the rank conditions on each rank's own code: ranks inside a rank-only region while the others are not are
    the culprits, whatever op they wait in. Without one: the majority, a lone barrier, or a familiar line.
    """
    if len(parts) < 2:
        return None, ""
    innocent = _rank_only_culprits(parts, states)
    if innocent is not None:
        return innocent, "rank_condition"
    innocent = _past_an_early_exit(parts, states)
    if innocent is not None:
        return innocent, EARLY_EXIT
    sizes = sorted((len(ranks) for ranks, _ in parts), reverse=True)
    if sizes[0] > sizes[1]:
        return max(parts, key=lambda p: len(p.ranks)), "majority"
    barriers = [p for p in parts if p.record["op"] == "barrier"]
    if len(barriers) == 1:
        return barriers[0], "barrier"
    everyone = ranks_of(parts)
    familiar = [p for p in parts if familiar_to(user_location(p.record), states, everyone)]
    if len(familiar) == 1:
        return familiar[0], "history"
    return None, ""


def _side_by_side(parts: list) -> list:
    """The mismatched calls, one row per partition; each row's description is worded by render (facts["side"])."""
    return [
        {
            "ranks": ranks,
            "group": rec["group"],
            "seq": rec["seq"],
            "op": rec["op"],
            "api": rec.get("api"),
            "shapes": rec.get("shapes"),
            "dtypes": rec.get("dtypes"),
            "site": rec.get("site"),
            "region": rec.get("region"),
            "wait_s": rec.get("age_s"),
            "state": rec.get("state"),
            "description": None,
        }
        for ranks, rec in parts
    ]


def _side_records(parts: list) -> list:
    return [rec for _, rec in parts]


def _in_ddp_forward(record: dict) -> bool:
    return (record.get("region") or {}).get("kind") == build.DDP_FORWARD


def _is_training_step(record: dict) -> bool:
    return record.get("api") == build.DDP_GRAD_ALLREDUCE or _in_ddp_forward(record)


# ---------------------------------------------------------------- one pass per finding kind


def ddp_forward_on_subset(parts: list, states: dict) -> dict | None:
    """The seed: some ranks call the DDP model (rank-local evaluation) and block in DDP.forward's own collective."""
    inside = [p for p in parts if _in_ddp_forward(p.record)]
    outside = [p for p in parts if p not in inside]
    if not inside or not outside:
        return None
    culprits, others = ranks_of(inside), ranks_of(outside)
    record = inside[0].record
    call_site = user_location(record)
    if len(culprits) > len(others) or familiar_to(call_site, states, others):
        return None  # the DDP call is the normal training step: someone else left the common path
    rebuild = record.get("api") == build.DDP_BUCKET_REBUILD
    return finding(
        "ddp_forward_on_subset",
        culprits,
        call_site,
        {"ddp_op": "bucket_rebuild" if rebuild else "buffer_broadcast", "mismatched": _side_by_side(parts)},
        culprits=culprits,
        others=others,
        call_site=call_site,
        rebuild=rebuild,
        record=record,
        waits=outside,
        side=_side_records(parts),
    )


def training_step_left_behind(culprit_parts: list, innocent, states: dict, rule: str, parts: list) -> dict | None:
    """Culprits inside a normal training step while the others wait elsewhere: a skipped collective or uneven data."""
    if not all(_is_training_step(rec) for _, rec in culprit_parts) or _is_training_step(innocent.record):
        return None
    culprits = ranks_of(culprit_parts)
    record = culprit_parts[0].record
    step_site = user_location(record)
    if not familiar_to(step_site, states, innocent.ranks):
        return None  # not a step the others have run: not the common training path
    skipped_site = innocent.record.get("site")
    if familiar_to(skipped_site, states, culprits):
        return skipped_collective(culprits, innocent, record, rule, parts)
    if _left_the_loop_together(
        culprits + innocent.ranks, states, innocent.record["group"], min(rec["seq"] for _, rec in parts)
    ):
        # Uneven inputs means leaving the training loop at different steps; these ranks matched a collective
        # outside training after their last step, so they left it together and one skipped what came next.
        return skipped_collective(culprits, innocent, record, "left_loop_together", parts)
    if left_with_data(step_site, innocent.ranks, states):
        return None  # the others left a loop with data left: by an exit of their own (departure.py names it)
    steps = {r: states[r].get("ddp_steps") for r in culprits + innocent.ranks}
    return finding(
        "uneven_inputs",
        culprits,
        step_site,
        {"mismatched": _side_by_side(parts), "culprit_rule": rule, "ddp_steps": {str(r): n for r, n in steps.items()}},
        culprits=culprits,
        record=record,
        innocent=innocent,
        side=_side_records(parts),
    )


def _left_the_loop_together(ranks, states: dict, group: str, below: int) -> bool:
    """Whether the last collective these ranks all completed on `group` before `below` was outside training."""
    seq = below - 1
    records = [completed_at(states[r], group, seq) for r in ranks]
    found = [rec for rec in records if rec]
    if seq < 0 or len(found) < len(records):  # a rank's record of that position is gone
        return False
    return not any(_is_training_step(rec) for rec in found) and len({rec["op"] for rec in found}) == 1


def skipped_collective(
    culprits: list, innocent, culprit_record: dict | None, rule: str, parts: list, exit_: dict | None = None
) -> dict:
    """Culprits went past a collective the others wait in (an early continue/return on some ranks).

    `exit_`: the rank condition of the early exit the culprits took, when known (the fix names it).
    """
    location = user_location(innocent.record)
    return finding(
        "skipped_collective",
        culprits,
        location,
        {"mismatched": _side_by_side(parts), "culprit_rule": rule, "culprits_now": None},
        culprits=culprits,
        innocent=innocent,
        culprit_record=culprit_record,
        location=location,
        exit=exit_,
        side=_side_records(parts),
    )


def collective_on_subset_or_mismatch(parts: list, states: dict) -> dict:
    """The culprit rules: who left the common path decides the kind (on a subset, skipped, uneven, or a mismatch)."""
    innocent, reason = _innocent_partition(parts, states)
    if innocent is None:
        record = parts[0].record
        return finding(
            "collective_mismatch",
            ranks_of(parts),
            user_location(record),
            {"mismatched": _side_by_side(parts), "culprit_rule": "none"},
            group=record["group"],
            parts=parts,
            side=_side_records(parts),
        )
    culprit_parts = [p for p in parts if p is not innocent]
    if reason == "rank_condition":
        return collective_on_subset(culprit_parts, innocent, states, reason, parts)
    if reason == EARLY_EXIT:
        return skipped_collective(
            ranks_of(culprit_parts),
            innocent,
            culprit_parts[0].record,
            reason,
            parts,
            rank_condition(states.get(innocent.ranks[0])),
        )
    found = training_step_left_behind(culprit_parts, innocent, states, reason, parts)
    if found:
        return found
    culprits = ranks_of(culprit_parts)
    record = culprit_parts[0].record
    if (
        familiar_to(user_location(record), states, innocent.ranks)
        and familiar_to(innocent.record.get("site"), states, culprits)
        and reason != "history"
    ):
        return skipped_collective(culprits, innocent, record, reason, parts)
    return collective_on_subset(culprit_parts, innocent, states, reason, parts)


def collective_on_subset(culprit_parts: list, innocent, states: dict, reason: str, parts: list) -> dict:
    """Culprits called a collective the others do not call at this point (often inside a rank-only branch)."""
    culprits = ranks_of(culprit_parts)
    record = culprit_parts[0].record
    location = user_location(record)
    return finding(
        "collective_on_subset",
        culprits,
        location,
        {"mismatched": _side_by_side(parts), "culprit_rule": reason},
        culprits=culprits,
        record=record,
        location=location,
        innocent=innocent,
        condition=rank_condition(states.get(culprits[0])),
        side=_side_records(parts),
    )


def shape_mismatch(parts: list, states: dict) -> dict | None:
    """The same collective at the same position, with different tensor sizes or dtypes."""
    if len({(rec.get("api"), rec["op"]) for _, rec in parts}) != 1 or len({shape_key(rec) for _, rec in parts}) < 2:
        return None
    sizes = sorted((len(ranks) for ranks, _ in parts), reverse=True)
    if sizes[0] > sizes[1]:
        common = max(parts, key=lambda p: len(p.ranks))
        culprit_parts = [p for p in parts if p is not common]
    else:
        empty = [p for p in parts if any(0 in shape for shape in p.record.get("shapes") or ())]
        culprit_parts = empty if 0 < len(empty) < len(parts) else parts
    culprits = ranks_of(culprit_parts)
    record = culprit_parts[0].record
    location = user_location(record)
    return finding(
        "shape_mismatch",
        culprits,
        location,
        {"mismatched": _side_by_side(parts)},
        culprits=culprits,
        record=record,
        location=location,
        parts=parts,
        side=_side_records(parts),
    )


def sequence_divergence(parts: list, states: dict) -> dict | None:
    """Ranks at different positions of one group: compare what each did at the earliest position anyone waits at."""
    if len({rec["seq"] for _, rec in parts}) < 2:
        return None  # one position: the passes after this one compare the calls themselves
    group = parts[0].record["group"]  # one group's partitions (proven_mismatches)
    low = min(rec["seq"] for _, rec in parts)
    regrouped = at_lowest(parts, states)
    if regrouped:
        found = shape_mismatch(regrouped, states)
        if found:
            found["evidence"]["sequence"] = {"group": group, "seq": low}
            return found
        if len({(rec.get("api"), rec["op"]) for _, rec in regrouped}) > 1:
            return ddp_forward_on_subset(regrouped, states) or collective_on_subset_or_mismatch(regrouped, states)
    ahead = ranks_of([p for p in parts if p.record["seq"] > low])
    record = next(rec for _, rec in parts if rec["seq"] > low)
    return finding(
        "collective_mismatch",
        ahead,
        user_location(record),
        {"mismatched": _side_by_side(parts), "culprit_rule": "sequence"},
        group=group,
        parts=parts,
        ahead=ahead,
        below=low,
        side=_side_records(parts),
    )


def group_order(waiting: dict, states: dict, world_size: int) -> dict | None:
    """Ranks blocked on different process groups each of which needs a rank blocked on the other."""
    groups = {rec["group"] for rec in waiting.values()}
    if len(groups) < 2:
        return None
    # a group is crossed when a member of it waits on another group: read once per group, not once per rank
    crossed = {
        group
        for group in groups
        if any(m in waiting and waiting[m]["group"] != group for m in members(states, group, world_size))
    }
    crossing = {rank: rec for rank, rec in waiting.items() if rec["group"] in crossed}
    if not crossing or not all(waits_in(rec) for rec in crossing.values()):
        # A rank that holds a returned op nobody waits on (async_op=True, a functional collective) runs its own code
        # meanwhile: it may yet issue the other group's call (an all_reduce overlapped with computation, then a
        # barrier on another group), so the crossing is not proven. If it never does, its peers' waits pass
        # `timeout` and the straggler reading names it.
        return None
    parts = partitions(crossing)
    by_group: dict = {}
    for rank, rec in crossing.items():
        by_group.setdefault(rec["group"], []).append(rank)
    sizes = sorted(len(r) for r in by_group.values())
    minority = min(by_group.values(), key=len) if sizes[0] < sizes[-1] else sorted(crossing)
    first = crossing[min(minority)]
    return finding(
        "group_order",
        minority,
        user_location(first),
        {"mismatched": _side_by_side(parts)},
        groups=[(g, r, crossing[r[0]]) for g, r in sorted(by_group.items())],
        side=_side_records(parts),
    )


def skipped_by_exited(live: dict, exited: set, grace: float, world_size: int) -> list:
    """Ranks that exited while others wait in a collective of a group they belong to: they skipped it."""
    findings = []
    waiting = blocked_records(live, grace)
    by_group: dict = {}
    for rank, rec in waiting.items():
        by_group.setdefault((rec["group"], rec["seq"]), []).append(rank)
    for (group, _), ranks in sorted(by_group.items()):
        group_members = set(members(live, group, world_size))  # asked in the test: once per exited rank
        gone = sorted(r for r in exited if r in group_members)
        if not gone:
            continue
        record = waiting[ranks[0]]
        parts = partitions({r: waiting[r] for r in ranks})
        if _all_of(ranks, live, _RANK_ONLY_REGIONS):
            # the waiting ranks got there inside a rank-only region: they called what the others never will
            findings.append(collective_on_subset(parts, None, live, "rank_condition", parts))
            continue
        findings.append(skipped_collective(gone, Partition(ranks, record), None, "exited", parts))
    return findings


def silent_ranks(silent: dict, live: dict, grace: float) -> list:
    """Ranks whose heartbeat stopped: gone (dead_rank) or present but frozen (unresponsive_rank).

    The watchdog leaves out local ranks that psutil sees busy (running, or using CPU); on another host it cannot
    look, and the summary says so.
    """
    findings = []
    waiting = sorted(r for r, s in live.items() if is_blocked(s, grace))
    for rank, view in sorted(silent.items()):
        process = view.get("process") or {}
        last: RankState | None = view.get("last_state") or None  # None: it never published
        record = waiting_record(last) if last else None
        here = user_line_now(last) if last else None
        silent_s = view.get("silent_s", 0.0)
        remote = bool(view.get("remote")) and not process
        dead = process.get("exists") is False or (remote and view.get("never_published") is None)
        location = user_location(record) if record else (user_line_now(last) if last else None)
        findings.append(
            finding(
                "dead_rank" if dead else "unresponsive_rank",
                [rank],
                location,
                {
                    "silent_s": round(silent_s, 1),
                    "process": process or None,
                    "waiting_ranks": waiting,
                    "last_seen": None,
                },
                rank=rank,
                pid=last.get("pid", "?") if last else "?",
                host=last.get("host", "?") if last else "?",
                remote=remote,
                exists=process.get("exists"),
                silent_s=silent_s,
                record=record,
                here=here,
                published=bool(last),
                status=process.get("why") or process.get("status", "unknown"),
            )
        )
    return findings


def collective_stuck(live: dict, blocked: set, timeout: float) -> dict | None:
    """Every rank in the same collective at the same position, and it never completes: below the program."""
    if blocked != set(live):
        return None  # a rank still busy may yet join: a straggler at most
    waiting = waiting_map(live)
    if len(waiting) != len(live) or len({(rec["group"], rec["seq"], rec.get("api")) for rec in waiting.values()}) != 1:
        return None
    record = next(iter(waiting.values()))
    longest = max(rec.get("age_s", 0.0) for rec in waiting.values())
    if longest < timeout:
        return None
    parts = partitions(waiting)
    return finding(
        "collective_stuck",
        sorted(waiting),
        user_location(record),
        {"wait_s": round(longest, 1), "mismatched": _side_by_side(parts)},
        count=len(waiting),
        wait_s=longest,
        record=record,
        side=_side_records(parts),
    )


def straggler(states: dict, blocked: set, timeout: float) -> dict | None:
    """Some ranks wait past the timeout while others keep working outside collectives: not (yet) a deadlock."""
    busy = sorted(r for r in states if r not in blocked and states[r].get("status") != build.EXITED)
    if not busy or not blocked:
        return None
    waits = {r: rec for r in blocked if (rec := waiting_record(states[r])) is not None}  # a blocked rank waits
    longest = max(rec.get("age_s", 0.0) for rec in waits.values())
    example = max(waits.values(), key=lambda rec: rec.get("age_s", 0.0))
    here = {r: user_line_now(states[r]) for r in busy}
    location = next((h for h in here.values() if h), None)
    evidence = {"waiting": sorted(blocked), "wait_s": round(longest, 1), "busy_at": {str(r): here[r] for r in busy}}
    return finding(
        "straggler",
        busy,
        location,
        evidence,
        waiting=sorted(blocked),
        wait_s=longest,
        timeout=timeout,
        record=example,
        busy=busy,
        location=location,
    )
