"""Turns rank snapshots into findings: small pure passes over plain data (no torch), run in the order of one table."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Callable, NamedTuple

from ..format import build as S

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..shapes import Finding, RankState, RecordDoc

DEADLOCK = "deadlock"
TIMEOUT = "timeout"
DUMP = "dump"
SILENT = "silent_rank"


class Partition(NamedTuple):
    """Ranks waiting in the same call (same position, op, line, region and tensors), and that call's record."""

    ranks: list
    record: RecordDoc


@dataclasses.dataclass
class Assessment:
    """What the watchdog should do now: report a proven deadlock, report after the timeout, or nothing."""

    verdict: str | None
    findings: list[Finding]
    fingerprint: str = ""


# ---------------------------------------------------------------- reading one rank's state

def waiting_record(state: RankState) -> RecordDoc | None:
    """The op this rank waits on: its oldest collective still in flight (point-to-point only when nothing else)."""
    inflight = state.get("inflight") or []
    if len(inflight) == 1:
        return inflight[0]  # the usual case, read several times per rank per verdict: no list to build
    collectives = [r for r in inflight if not r.get("p2p")]
    pool = collectives or inflight
    return max(pool, key=lambda r: r.get("age_s", 0.0)) if pool else None


def is_blocked(state: dict, grace: float) -> bool:
    """In a collective for at least `grace` seconds, with no op started or finished meanwhile."""
    record = waiting_record(state)
    return (record is not None and record.get("age_s", 0.0) >= grace
            and state.get("idle_s", 0.0) >= grace and state.get("status") != S.EXITED)


def user_line_now(state: dict) -> dict | None:
    """Where the rank's main thread stands now in the user's code (innermost non-internal frame), if stacks came."""
    for stack in state.get("stacks") or ():
        if stack.get("main"):
            for frame in reversed(stack.get("frames") or ()):
                if not frame.get("internal"):
                    return S.site(frame["file"], frame["line"], frame["function"])
    return None


def describe_op(record: dict) -> str:
    """'broadcast (DDP buffer sync) inside DistributedDataParallel.forward called at val.py:42'."""
    text = record["op"]
    api = record.get("api")
    if api == S.DDP_BUFFER_BROADCAST:
        text += " of module buffers"
    elif api == S.DDP_GRAD_ALLREDUCE:
        return f"{text} of gradients inside backward() at {S.short_site(record.get('site'))}"
    elif api == S.DDP_BUCKET_REBUILD:
        text += " for DDP's gradient bucket rebuild"
    elif api == S.FLIGHT_RECORDER_ONLY:
        text += " (seen by torch's Flight Recorder only: issued outside Python, e.g. compiled code or torch.ops)"
    elif api and api != record["op"]:
        text += f" ({api})"
    framework = record.get("framework") or {}
    via = record.get("via")
    if framework.get("description"):
        text += f" of {framework['description']}"
    elif via:
        text += f" via {via.get('function')} ({via.get('package')})"
    region = record.get("region")
    if region and region.get("kind") == S.DDP_FORWARD:
        return f"{text} inside DistributedDataParallel.forward called at {S.short_site(region.get('site'))}"
    if region and region.get("kind") == S.FSDP_FORWARD:
        return f"{text} inside FSDP2's forward (fully_shard) called at {S.short_site(region.get('site'))}"
    if region and region.get("kind") == S.OBJECT_COLLECTIVE:
        return f"{text} inside {region.get('api')} at {S.short_site(region.get('site') or record.get('site'))}"
    return f"{text} at {S.short_site(record.get('site'))}"


def user_location(record: dict) -> dict | None:
    """The user's line that made this call: the DDP/object-collective call site when inside one, else its own site."""
    region = record.get("region")
    if region and region.get("site"):
        return region["site"]
    return record.get("site")


def rank_list(ranks) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2,5'; [3] -> 'rank 3'."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start, prev = [], None, None
    for rank in ranks:
        if start is None:
            start = prev = rank
        elif rank == prev + 1:
            prev = rank
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = rank
    parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return "ranks " + ",".join(parts)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verb(ranks, one: str, many: str) -> str:
    return one if len(set(ranks)) == 1 else many


# ---------------------------------------------------------------- where every rank stands (STAT-style groups)

def _position_key(state: dict, grace: float) -> tuple:
    if state.get("status") == S.EXITED:
        return ("exited",)
    if state.get("stale"):
        here = user_line_now(state)
        return ("silent", here and (here["file"], here["line"], here["function"]))
    record = waiting_record(state)
    if record is None or record.get("age_s", 0.0) < grace:
        here = user_line_now(state)
        return ("busy", here and (here["file"], here["line"], here["function"]))
    region = record.get("region") or {}
    site = record.get("site") or {}
    rsite = region.get("site") or {}
    return ("waiting", record["group"], record["seq"], record.get("api"), record["op"],
            site.get("file"), site.get("line"), region.get("kind"), rsite.get("file"), rsite.get("line"))


def positions(states: dict, grace: float) -> list:
    """Ranks grouped by where they stand, largest group first: [{ranks, state, where, wait_s, record}]."""
    groups: dict = {}
    for rank in sorted(states):
        key = _position_key(states[rank], grace)
        groups.setdefault(key, []).append(rank)
    out = []
    for key, ranks in groups.items():
        first = states[ranks[0]]
        record = waiting_record(first) if key[0] == "waiting" else None
        if key[0] == "waiting":
            waits = [waiting_record(states[r]).get("age_s", 0.0) for r in ranks]
            where = describe_op(record)
        elif key[0] == "busy":
            waits = [states[r].get("idle_s", 0.0) for r in ranks]
            here = user_line_now(first)
            where = "busy outside collectives" + (f" at {S.short_site(here)}" if here else "")
        elif key[0] == "silent":
            here = user_line_now(first)
            waits = [0.0]
            where = "silent: no answer" + (f" (last seen at {S.short_site(here)})" if here else "")
        else:
            waits, where = [0.0], "exited"
        out.append({"ranks": ranks, "state": key[0], "where": where, "wait_s": round(max(waits), 1),
                    "record": record})
    out.sort(key=lambda g: (-len(g["ranks"]), g["ranks"][0]))
    return out


# ---------------------------------------------------------------- history: has a rank been at this line before?

def _same_line(a: dict | None, b: dict | None) -> bool:
    return bool(a and b and a.get("file") == b.get("file") and a.get("line") == b.get("line"))


def has_been_at(state: dict, site: dict | None) -> bool:
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


def _inflight_count_at(state: dict, site: dict) -> int:
    """Site counts include the call in flight now; "been here before" must not count it."""
    return sum(1 for r in state.get("inflight") or () if _same_line(r.get("site"), site))


def _familiar_to(site: dict | None, states: dict, ranks) -> bool:
    return bool(ranks) and all(has_been_at(states[rank], site) for rank in ranks)


# ---------------------------------------------------------------- splitting the waiting ranks

def _partitions(waiting: dict) -> list:
    """Ranks waiting on one group split by what they wait in: one Partition per distinct call."""
    parts: dict = {}
    for rank, record in sorted(waiting.items()):
        region = record.get("region") or {}
        key = (record["seq"], record.get("api"), record["op"], _site_key(record.get("site")),
               region.get("kind"), _site_key(region.get("site")), _shape_key(record))
        parts.setdefault(key, Partition([], record)).ranks.append(rank)
    return list(parts.values())


def _site_key(site: dict | None):
    return (site["file"], site["line"]) if site else None


def _shape_key(record: dict):
    return (tuple(tuple(s) for s in record.get("shapes") or ()), tuple(record.get("dtypes") or ()))


def _ranks_of(parts) -> list:
    return sorted(r for ranks, _ in parts for r in ranks)


def rank_condition(state: dict | None) -> dict | None:
    """The rank condition (if-branch, early exit, rank-only decorator) the rank's own code stands under, if any."""
    found = (state or {}).get("rank_condition")
    return found if isinstance(found, dict) and isinstance(found.get("condition"), dict) else None


def _condition_kind(state: dict | None) -> str | None:
    found = rank_condition(state)
    return found["condition"].get("kind") if found else None


# Inside one of these, a line runs on some ranks only. After an early exit (`if rank == 1: continue` above it) the
# opposite holds: a rank standing there did not take the exit, so the ranks elsewhere did.
_RANK_ONLY_REGIONS = ("if", "else", "while", "decorator")
EARLY_EXIT = "early_exit"


def _all_of(ranks, states: dict, kinds) -> bool:
    return bool(ranks) and all(_condition_kind(states.get(r)) in kinds for r in ranks)


def _none_of(ranks, states: dict, kinds) -> bool:
    return not any(_condition_kind(states.get(r)) in kinds for r in ranks)


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
    everyone = _ranks_of(parts)
    familiar = [p for p in parts if _familiar_to(user_location(p.record), states, everyone)]
    if len(familiar) == 1:
        return familiar[0], "history"
    return None, ""


def _side_by_side(parts: list) -> list:
    return [{"ranks": ranks, "group": rec["group"], "seq": rec["seq"], "op": rec["op"], "api": rec.get("api"),
             "shapes": rec.get("shapes"), "dtypes": rec.get("dtypes"), "site": rec.get("site"),
             "region": rec.get("region"), "wait_s": rec.get("age_s"), "state": rec.get("state"),
             "description": describe_op(rec)}
            for ranks, rec in parts]


def _in_ddp_forward(record: dict) -> bool:
    return (record.get("region") or {}).get("kind") == S.DDP_FORWARD


def _is_training_step(record: dict) -> bool:
    return record.get("api") == S.DDP_GRAD_ALLREDUCE or _in_ddp_forward(record)


def _waits_text(parts) -> str:
    return "; ".join(f"{rank_list(r)} {_verb(r, 'waits', 'wait')} in {describe_op(rec)}" for r, rec in parts)


# ---------------------------------------------------------------- one pass per finding kind

def ddp_forward_on_subset(parts: list, states: dict) -> dict | None:
    """The seed: some ranks call the DDP model (rank-local evaluation) and block in DDP.forward's own collective."""
    inside = [p for p in parts if _in_ddp_forward(p.record)]
    outside = [p for p in parts if p not in inside]
    if not inside or not outside:
        return None
    culprits, others = _ranks_of(inside), _ranks_of(outside)
    record = inside[0].record
    call_site = user_location(record)
    if len(culprits) > len(others) or _familiar_to(call_site, states, others):
        return None  # the DDP call is the normal training step: someone else left the common path
    rebuild = record.get("api") == S.DDP_BUCKET_REBUILD
    if rebuild:
        why = ("DDP rebuilds its gradient buckets once, on the first grad-enabled forward after the first backward, "
               "and that rebuild broadcasts across all ranks")
        short_why = "the one-time gradient bucket rebuild in DDP.forward is a broadcast every rank must join"
    else:
        why = ("DDP's forward broadcasts the module's buffers (such as BatchNorm running statistics) from rank 0 "
               "to every rank before computing, so every rank must run it")
        short_why = "DDP.forward broadcasts BatchNorm statistics and other buffers to every rank"
    summary = (f"{_sentence(rank_list(culprits))} called the DistributedDataParallel model at "
               f"{S.short_site(call_site)} ({S.format_site(call_site)}) while {rank_list(others)} did not: "
               f"{why}. {_sentence(rank_list(culprits))} {_verb(culprits, 'blocks', 'block')} in "
               f"{describe_op(record)}; {_waits_text(outside)}. Neither side can ever finish.")
    fix = (f"For rank-local work (evaluation, logging) call the wrapped module directly: `model.module(x)` instead of "
           f"`model(x)` at {S.short_site(call_site)}; or run that forward on every rank ({short_why}).")
    return S.finding("ddp_forward_on_subset", culprits, summary, fix, call_site,
                     {"ddp_op": "bucket_rebuild" if rebuild else "buffer_broadcast", "mismatched": _side_by_side(parts)})


def training_step_left_behind(culprit_parts: list, innocent, states: dict, rule: str, parts: list) -> dict | None:
    """Culprits inside a normal training step while the others wait elsewhere: a skipped collective or uneven data."""
    if not all(_is_training_step(rec) for _, rec in culprit_parts) or _is_training_step(innocent.record):
        return None
    culprits = _ranks_of(culprit_parts)
    record = culprit_parts[0].record
    step_site = user_location(record)
    if not _familiar_to(step_site, states, innocent.ranks):
        return None  # not a step the others have run: not the common training path
    skipped_site = innocent.record.get("site")
    if _familiar_to(skipped_site, states, culprits):
        return skipped_collective(culprits, innocent, record, rule, parts)
    if _left_the_loop_together(culprits + innocent.ranks, states, innocent.record["group"],
                               min(rec["seq"] for _, rec in parts)):
        # Uneven inputs means leaving the training loop at different steps; these ranks matched a collective
        # outside training after their last step, so they left it together and one skipped what came next.
        return skipped_collective(culprits, innocent, record, "left_loop_together", parts)
    steps = {r: states[r].get("ddp_steps") for r in culprits + innocent.ranks}
    summary = (f"{_sentence(rank_list(culprits))} {_verb(culprits, 'is', 'are')} still training "
               f"({describe_op(record)}) while {rank_list(innocent.ranks)} finished the loop and "
               f"{_verb(innocent.ranks, 'waits', 'wait')} in {describe_op(innocent.record)}: the ranks ran different "
               "numbers of training steps, so the extra step's collectives have no partner.")
    fix = ("Give every rank the same number of batches: use `DistributedSampler(dataset, drop_last=True)` (or pad "
           "the dataset to a multiple of the world size), or wrap the loop in DDP's `with model.join():` context "
           "manager, which lets ranks that run out of data shadow the others' collectives.")
    return S.finding("uneven_inputs", culprits, summary, fix, step_site,
                     {"mismatched": _side_by_side(parts), "culprit_rule": rule,
                      "ddp_steps": {str(r): n for r, n in steps.items()}})


def _completed_at(state: dict, group: str, seq: int) -> dict | None:
    for record in state.get("recent") or ():
        if (record.get("group") == group and record.get("seq") == seq and not record.get("p2p")
                and record.get("state") == S.COMPLETED):
            return record
    return None


def _left_the_loop_together(ranks, states: dict, group: str, below: int) -> bool:
    """Whether the last collective these ranks all completed on `group` before `below` was outside training."""
    seq = below - 1
    records = [_completed_at(states[r], group, seq) for r in ranks]
    if seq < 0 or not all(records):
        return False
    return not any(_is_training_step(rec) for rec in records) and len({rec["op"] for rec in records}) == 1


def skipped_collective(culprits: list, innocent, culprit_record: dict, rule: str, parts: list) -> dict:
    """Culprits went past a collective the others wait in (an early continue/return on some ranks)."""
    skipped = innocent.record
    location = user_location(skipped)
    now = describe_op(culprit_record) if culprit_record else "exited"
    summary = (f"{_sentence(rank_list(culprits))} never reached {describe_op(skipped)}, where "
               f"{rank_list(innocent.ranks)} {_verb(innocent.ranks, 'waits', 'wait')}: "
               f"{_verb(culprits, 'it', 'they')} went past it and {_verb(culprits, 'is', 'are')} now "
               f"{'in ' + now if culprit_record else 'gone (the rank exited)'}.")
    fix = (f"Every rank must reach the collective at {S.short_site(location)}: look for an early `return`, "
           "`continue` or `break` taken on some ranks only (often under a rank condition) before it, and move "
           "the collective above it or make the exit happen on every rank.")
    return S.finding("skipped_collective", culprits, summary, fix, location,
                     {"mismatched": _side_by_side(parts), "culprit_rule": rule,
                      "culprits_now": now})


def collective_on_subset_or_mismatch(parts: list, states: dict) -> dict:
    innocent, reason = _innocent_partition(parts, states)
    side = _side_by_side(parts)
    if innocent is None:
        ranks = _ranks_of(parts)
        record = parts[0].record
        calls = "; ".join(f"{rank_list(r)}: {describe_op(rec)} (seq {rec['seq']})" for r, rec in parts)
        summary = (f"The ranks issued different collectives at the same point of group {record['group']}: {calls}. "
                   "They can never match.")
        fix = ("Make every rank issue the same collectives in the same order on each process group; look for a "
               "branch on rank, data or configuration that changes which collective runs.")
        return S.finding("collective_mismatch", ranks, summary, fix, user_location(record),
                         {"mismatched": side, "culprit_rule": "none"})
    culprit_parts = [p for p in parts if p is not innocent]
    if reason == "rank_condition":
        return collective_on_subset(culprit_parts, innocent, states, reason, side)
    if reason == EARLY_EXIT:
        found = skipped_collective(_ranks_of(culprit_parts), innocent, culprit_parts[0].record, reason, parts)
        exit_ = rank_condition(states.get(innocent.ranks[0]))
        found["fix"] += (f" Here it is the exit at line {exit_['condition'].get('exit_line')} under "
                         f"`{exit_['condition']['text']}` ({S.short_site(exit_['frame'])}).")
        return found
    found = training_step_left_behind(culprit_parts, innocent, states, reason, parts)
    if found:
        return found
    culprits = _ranks_of(culprit_parts)
    record = culprit_parts[0].record
    if (_familiar_to(user_location(record), states, innocent.ranks)
            and _familiar_to(innocent.record.get("site"), states, culprits) and reason != "history"):
        return skipped_collective(culprits, innocent, record, reason, parts)
    return collective_on_subset(culprit_parts, innocent, states, reason, side)


def collective_on_subset(culprit_parts: list, innocent, states: dict, reason: str, side: list) -> dict:
    """Culprits called a collective the others do not call at this point (often inside a rank-only branch)."""
    culprits = _ranks_of(culprit_parts)
    record = culprit_parts[0].record
    location = user_location(record)
    if innocent is None:
        elsewhere = "never reach: they exited"
    else:
        elsewhere = (f"{_verb(innocent.ranks, 'does', 'do')} not call at this point: "
                     f"{_verb(innocent.ranks, 'it waits', 'they wait')} in {describe_op(innocent.record)}")
    others = rank_list(innocent.ranks) if innocent is not None else "the other ranks"
    summary = (f"{_sentence(rank_list(culprits))} called {describe_op(record)} ({S.format_site(location)}), "
               f"which {others} {elsewhere}. Neither side can ever finish.")
    condition = rank_condition(states.get(culprits[0]))
    fix = framework_fix(record, location, condition) or (
        f"Run the collective at {S.short_site(location)} on every rank of the group (move it out of "
        + (f"the rank-only branch `{condition['condition']['text']}`" if condition else "any rank-only branch")
        + "), or give it a process group made of only the ranks that call it (`dist.new_group(ranks=...)`).")
    return S.finding("collective_on_subset", culprits, summary, fix, location,
                     {"mismatched": side, "culprit_rule": reason})


# Fixes in the framework's own words: (package, method name the user's code called) -> the fix. `{cond}` is the
# rank condition's text, `{line}` the user's line.
FRAMEWORK_FIXES = {
    ("lightning", "barrier"): "Call `trainer.strategy.barrier()` on every rank: move it out of `{cond}` at {line} "
                              "(a barrier only some ranks reach waits forever).",
    ("lightning", "broadcast"): "Call `trainer.strategy.broadcast(...)` on every rank (it is a collective): move it "
                                "out of `{cond}` at {line}, and use the result on the rank that needs it.",
    ("lightning", "reduce"): "Call the reduction (`trainer.strategy.reduce`, `self.all_gather`) on every rank: move it "
                             "out of `{cond}` at {line}.",
    ("lightning", "all_gather"): "Call `self.all_gather(...)` on every rank: move it out of `{cond}` at {line}, then "
                                 "use the result on rank zero only.",
    ("lightning", "log"): "Call `self.log(..., sync_dist=True)` on every rank, or log on rank zero only with "
                          "`self.log(..., rank_zero_only=True)` and without sync_dist (at {line}).",
    ("accelerate", "wait_for_everyone"): "Call `accelerator.wait_for_everyone()` on every process: move it out of "
                                         "`{cond}` at {line}.",
    ("accelerate", "gather"): "Call `accelerator.gather(...)` on every process (it is a collective): move it out "
                              "of `{cond}` at {line} and use the result on the main process only.",
    ("accelerate", "gather_for_metrics"): "Call `accelerator.gather_for_metrics(...)` on every process: move it "
                                          "out of `{cond}` at {line} and compute the metric on the main process only.",
    ("accelerate", "reduce"): "Call `accelerator.reduce(...)` on every process: move it out of `{cond}` at {line}.",
    ("accelerate", "broadcast"): "Call the broadcast on every process: move it out of `{cond}` at {line}.",
}


def framework_fix(record: dict, location: dict | None, condition: dict | None) -> str | None:
    """The fix for a collective a framework issued for the user, in that framework's terms; None if not known."""
    if str(record.get("api") or "").startswith("funcol."):
        return (f"A DTensor operation (`full_tensor()`, `redistribute()`, an op on sharded tensors) or a functional "
                f"collective issues a collective on every rank of its mesh or group: run the call at "
                f"{S.short_site(location)} on every rank (move it out of "
                + (f"`{condition['condition']['text']}`" if condition else "the rank-only branch")
                + "), and use its result on the rank that needs it.")
    if (record.get("region") or {}).get("kind") == S.FSDP_FORWARD:
        return (f"A fully_shard (FSDP2) model's forward all-gathers its parameters from every rank, so run the forward "
                f"at {S.short_site(location)} on every rank (evaluate on every rank and reduce the metric), or build "
                "an unsharded copy for rank-local work: on every rank take `model.state_dict()` and call "
                "`.full_tensor()` on each DTensor, then load it into a plain model used on one rank only.")
    via = record.get("via") or {}
    framework = record.get("framework") or {}
    package = str(framework.get("framework") or via.get("package") or "")
    method = str(framework.get("call") or via.get("function") or "").rsplit(".", 1)[-1]
    for (known_package, known_method), text in FRAMEWORK_FIXES.items():
        if package.startswith(known_package) and method == known_method:
            cond = condition["condition"]["text"] if condition else "the rank-only branch"
            return text.format(cond=cond, line=S.short_site(location))
    return None


def shape_mismatch(parts: list, states: dict) -> dict | None:
    """The same collective at the same position, with different tensor sizes or dtypes."""
    if len({(rec.get("api"), rec["op"]) for _, rec in parts}) != 1 or len({_shape_key(rec) for _, rec in parts}) < 2:
        return None
    sizes = sorted((len(ranks) for ranks, _ in parts), reverse=True)
    if sizes[0] > sizes[1]:
        common = max(parts, key=lambda p: len(p.ranks))
        culprit_parts = [p for p in parts if p is not common]
    else:
        empty = [p for p in parts if any(0 in shape for shape in p.record.get("shapes") or ())]
        culprit_parts = empty if 0 < len(empty) < len(parts) else parts
    culprits = _ranks_of(culprit_parts)
    record = culprit_parts[0].record
    shapes = "; ".join(f"{rank_list(r)}: {_shape_text(rec)}" for r, rec in parts)
    summary = (f"{_sentence(rank_list(culprits))} passed different tensors to {record['op']} at "
               f"{S.short_site(record.get('site'))} (group {record['group']}, seq {record['seq']}): {shapes}. "
               "On gloo an empty tensor returns at once on its rank while the others wait forever; other size "
               "differences abort or corrupt.")
    fix = (f"Make the tensor passed at {S.short_site(user_location(record))} the same shape and dtype on every rank "
           "(pad variable-length data, or all_gather the sizes first and then the padded tensors).")
    return S.finding("shape_mismatch", culprits, summary, fix, user_location(record),
                     {"mismatched": _side_by_side(parts)})


def _shape_text(record: dict) -> str:
    shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in record.get("shapes") or ()) or "no tensor"
    return f"{shapes} {','.join(record.get('dtypes') or ())}".strip()


def _record_at(state: dict, group: str, seq: int) -> dict | None:
    for record in list(state.get("recent") or ()) + list(state.get("inflight") or ()):
        if record.get("group") == group and record.get("seq") == seq and not record.get("p2p"):
            return record
    return None


def sequence_divergence(parts: list, states: dict) -> dict | None:
    """Ranks at different positions of one group: compare what each did at the earliest position anyone waits at."""
    if len({rec["seq"] for _, rec in parts}) < 2:
        return None  # one position: the passes after this one compare the calls themselves
    group = parts[0].record["group"]  # one group's partitions (proven_mismatches)
    low = min(rec["seq"] for _, rec in parts)
    at_low = {}
    for ranks, rec in parts:
        for rank in ranks:
            at_low[rank] = rec if rec["seq"] == low else _record_at(states[rank], group, low)
    known = {r: rec for r, rec in at_low.items() if rec is not None}
    regrouped = _partitions(known) if len(known) == len(at_low) else []
    if regrouped:
        found = shape_mismatch(regrouped, states)
        if found:
            found["evidence"]["sequence"] = {"group": group, "seq": low}
            return found
        if len({(rec.get("api"), rec["op"]) for _, rec in regrouped}) > 1:
            return ddp_forward_on_subset(regrouped, states) or collective_on_subset_or_mismatch(regrouped, states)
    ahead = _ranks_of([p for p in parts if p.record["seq"] > low])
    summary = (f"On group {group} the ranks wait at different positions: "
               + "; ".join(f"{rank_list(r)} at seq {rec['seq']} ({describe_op(rec)})" for r, rec in parts)
               + f". {_sentence(rank_list(ahead))} got past seq {low} without the others.")
    fix = ("Some collective completed on part of the group only (on gloo: an empty tensor); compare the ranks' "
           "collectives just before these lines and make them identical.")
    record = next(rec for _, rec in parts if rec["seq"] > low)
    return S.finding("collective_mismatch", ahead, summary, fix, user_location(record),
                     {"mismatched": _side_by_side(parts), "culprit_rule": "sequence"})


def group_order(waiting: dict, states: dict, world_size: int) -> dict | None:
    """Ranks blocked on different process groups each of which needs a rank blocked on the other."""
    groups = {rec["group"] for rec in waiting.values()}
    if len(groups) < 2:
        return None
    crossing = {}
    for rank, rec in waiting.items():
        members = _members(states, rec["group"], world_size)
        if any(m in waiting and waiting[m]["group"] != rec["group"] for m in members if m != rank):
            crossing[rank] = rec
    if not crossing:
        return None
    parts = _partitions(crossing)
    by_group: dict = {}
    for rank, rec in crossing.items():
        by_group.setdefault(rec["group"], []).append(rank)
    sizes = sorted(len(r) for r in by_group.values())
    minority = min(by_group.values(), key=len) if sizes[0] < sizes[-1] else sorted(crossing)
    first = crossing[min(minority)]
    summary = ("The ranks issue collectives on different process groups in different orders: "
               + "; ".join(f"{rank_list(r)} {_verb(r, 'waits', 'wait')} on group {g} in {describe_op(crossing[r[0]])}"
                           for g, r in sorted(by_group.items()))
               + ". Each group needs a rank that is blocked on the other, so neither can finish.")
    fix = ("Issue collectives on every process group in the same order on all ranks (for example, always the "
           "data-parallel group before the model-parallel one); do not let rank-dependent branches reorder them.")
    return S.finding("group_order", minority, summary, fix, user_location(first), {"mismatched": _side_by_side(parts)})


def skipped_by_exited(live: dict, exited: set, grace: float, world_size: int) -> list:
    """Ranks that exited while others wait in a collective of a group they belong to: they skipped it."""
    findings = []
    waiting = {r: waiting_record(s) for r, s in live.items() if is_blocked(s, grace)}
    by_group: dict = {}
    for rank, rec in waiting.items():
        by_group.setdefault((rec["group"], rec["seq"]), []).append(rank)
    for (group, _), ranks in sorted(by_group.items()):
        gone = sorted(r for r in exited if r in _members(live, group, world_size))
        if not gone:
            continue
        record = waiting[ranks[0]]
        parts = _partitions({r: waiting[r] for r in ranks})
        if _all_of(ranks, live, _RANK_ONLY_REGIONS):
            # the waiting ranks got there inside a rank-only region: they called what the others never will
            findings.append(collective_on_subset(parts, None, live, "rank_condition", _side_by_side(parts)))
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
        last = view.get("last_state") or {}
        record = waiting_record(last) if last else None
        here = user_line_now(last) if last else None
        if record:
            where = "in " + describe_op(record)
        elif here:
            where = "at " + S.short_site(here)
        elif last:
            where = "outside collectives (it could not be asked for a stack)"
        else:
            where = "nowhere known: it never published its state"
        silent_s = view.get("silent_s", 0.0)
        remote = bool(view.get("remote")) and not process
        if process.get("exists") is False or (remote and view.get("never_published") is None):
            kind = "dead_rank"
            summary = (f"Rank {rank} (pid {last.get('pid', '?')} on {last.get('host', '?')}) "
                       f"{'is silent' if remote else 'is gone'}: its heartbeat "
                       f"stopped {silent_s:.0f} s ago"
                       + (" and the process no longer exists" if process.get("exists") is False else "")
                       + f"; it was last {where}."
                       + (" It runs on another host, where ddpwatch cannot look at the process: it cannot tell a "
                          "dead or frozen rank from one busy in a long call that holds the GIL (which silences the "
                          "heartbeat too)." if remote else ""))
            fix = ("Find why the process died: its own log (out-of-memory killer, segfault, an exception), "
                   "`dmesg`, and the launcher's exit summary. The other ranks will wait forever for it.")
        else:
            kind = "unresponsive_rank"
            status = process.get("why") or process.get("status", "unknown")
            summary = (f"Rank {rank} (pid {last.get('pid', '?')}) exists but has not answered for {silent_s:.0f} s "
                       f"(process status: {status}); neither its training thread nor ddpwatch's watchdog moves. "
                       f"It was last {where}.")
            fix = ("A stopped (SIGSTOP, Ctrl-Z), traced (a debugger) or dead process runs no code until it is "
                   "resumed: check its state with `cat /proc/<pid>/status` and `py-spy dump --native --pid`; resume "
                   "(kill -CONT) or restart it.")
        location = user_location(record) if record else (user_line_now(last) if last else None)
        findings.append(S.finding(kind, [rank], summary, fix, location,
                                  {"silent_s": round(silent_s, 1), "process": process or None,
                                   "waiting_ranks": waiting, "last_seen": where}))
    return findings


def collective_stuck(live: dict, blocked: set, timeout: float) -> dict | None:
    """Every rank in the same collective at the same position, and it never completes: below the program."""
    if blocked != set(live):
        return None  # a rank still busy may yet join: a straggler at most
    waiting = _waiting_map(live)
    if len(waiting) != len(live) or len({(rec["group"], rec["seq"], rec.get("api")) for rec in waiting.values()}) != 1:
        return None
    record = next(iter(waiting.values()))
    longest = max(rec.get("age_s", 0.0) for rec in waiting.values())
    if longest < timeout:
        return None
    summary = (f"All {len(waiting)} ranks have waited {longest:.0f} s in the same collective, {describe_op(record)} "
               f"(group {record['group']}, seq {record['seq']}), and it does not complete: the program agrees, "
               "the transport does not (network, device or library fault).")
    fix = ("Check the interconnect and devices: NCCL_DEBUG=INFO logs, `nvidia-smi`, network between hosts "
           "(firewalls, wrong interface: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME); if the op is huge, raise the "
           "timeout.")
    return S.finding("collective_stuck", sorted(waiting), summary, fix, user_location(record),
                     {"wait_s": round(longest, 1), "mismatched": _side_by_side(_partitions(waiting))})


def straggler(states: dict, blocked: set, timeout: float) -> dict | None:
    busy = sorted(r for r in states if r not in blocked and states[r].get("status") != S.EXITED)
    if not busy or not blocked:
        return None
    waits = {r: waiting_record(states[r]) for r in blocked}
    longest = max(rec.get("age_s", 0.0) for rec in waits.values())
    example = max(waits.values(), key=lambda rec: rec.get("age_s", 0.0))
    here = {r: user_line_now(states[r]) for r in busy}
    location = next((h for h in here.values() if h), None)
    where = f" (now at {S.format_site(location)})" if location else ""
    summary = (f"{_sentence(rank_list(blocked))} waited {longest:.0f} s, longer than the {timeout:g} s timeout, "
               f"in {describe_op(example)}, while {rank_list(busy)} kept working outside collectives{where}. "
               "This is a straggler, not a proven deadlock: the wait ends if the busy ranks reach the collective.")
    fix = ("If this work is expected (long validation or checkpointing on one rank), raise ddpwatch's timeout or "
           "spread the work across ranks; otherwise the stack below shows where the busy ranks are stuck.")
    return S.finding("straggler", busy, summary, fix, location,
                     {"waiting": sorted(blocked), "wait_s": round(longest, 1), "busy_at": {str(r): here[r] for r in busy}})


# ---------------------------------------------------------------- the table: every pass, its stage, its kinds

class Stage(NamedTuple):
    """A situation assess() looks for; every pass of one stage takes the same arguments (`takes`)."""

    name: str
    takes: str  # the arguments each pass of the stage is called with, in this order
    verdict: str  # the incident's trigger when a pass of this stage finds something
    fingerprint_suffix: str = ""  # the same waits seen by another stage are another cause: reported again


# The stages in the order assess() tries them (the conditions between them are assess()'s own).
STAGE_SILENT = Stage("silent", "silent, live, grace", SILENT, "-silent")  # heartbeats stopped while others wait
STAGE_CROSSING = Stage("crossing", "waiting, live, world_size", DEADLOCK)  # every live rank blocked, any group
STAGE_MISMATCH = Stage("mismatch", "parts, states", DEADLOCK)  # one group's calls can never match (classify)
STAGE_EXITED = Stage("exited", "live, exited, grace, world_size", DEADLOCK, "-exited")  # ranks gone, others wait
STAGE_TIMEOUT = Stage("timeout", "live, blocked, timeout", TIMEOUT)  # a wait outlasted the timeout
STAGES = (STAGE_SILENT, STAGE_CROSSING, STAGE_MISMATCH, STAGE_EXITED, STAGE_TIMEOUT)


class FindingPass(NamedTuple):
    """One row of FINDING_PASSES: a pass, the stage it runs in, and every finding kind it may emit."""

    run: Callable  # (the stage's arguments) -> a Finding, a list of them, or None
    stage: Stage
    kinds: tuple


# The one list of finding kinds (FINDING_KINDS is read from it; a pass emitting a kind its row does not name is an
# error). Within a stage the first row, in this order, that finds something wins.
# A pass that builds on others (sequence_divergence, skipped_by_exited) lists every kind it may hand on.
FINDING_PASSES = (
    FindingPass(silent_ranks, STAGE_SILENT, ("dead_rank", "unresponsive_rank")),
    FindingPass(group_order, STAGE_CROSSING, ("group_order",)),
    # first: ranks at different positions are compared where they diverged, with the passes below
    FindingPass(sequence_divergence, STAGE_MISMATCH, ("shape_mismatch", "ddp_forward_on_subset", "collective_on_subset",
                                                      "skipped_collective", "uneven_inputs", "collective_mismatch")),
    FindingPass(shape_mismatch, STAGE_MISMATCH, ("shape_mismatch",)),
    FindingPass(ddp_forward_on_subset, STAGE_MISMATCH, ("ddp_forward_on_subset",)),
    # last: it always finds something (collective_mismatch when no rule names a culprit)
    FindingPass(collective_on_subset_or_mismatch, STAGE_MISMATCH,
                ("collective_on_subset", "skipped_collective", "uneven_inputs", "collective_mismatch")),
    FindingPass(skipped_by_exited, STAGE_EXITED, ("collective_on_subset", "skipped_collective")),
    FindingPass(collective_stuck, STAGE_TIMEOUT, ("collective_stuck",)),
    FindingPass(straggler, STAGE_TIMEOUT, ("straggler",)),
)


def kinds_of(passes) -> tuple:
    """Every kind the table's rows may emit, each once, in table order."""
    return tuple(dict.fromkeys(kind for row in passes for kind in row.kinds))


FINDING_KINDS = kinds_of(FINDING_PASSES)


def _declared(row: FindingPass, found: Finding) -> Finding:
    """A pass may emit only the kinds its row declares: a kind cannot exist outside the table."""
    if found["kind"] not in row.kinds:
        raise ValueError(f"{row.run.__name__} emitted finding kind {found['kind']!r}, "
                         f"not one of its row's kinds {row.kinds}")
    return found


def stage_findings(stage: Stage, *arguments, passes: tuple | None = None) -> list[Finding]:
    """The findings of the first pass of `stage` (in table order) that finds anything; [] when none does.

    `passes`: the table to run, FINDING_PASSES unless given (read at call time, so a test may patch it).
    """
    for row in FINDING_PASSES if passes is None else passes:
        if row.stage != stage:
            continue
        found = row.run(*arguments)
        found = [found] if isinstance(found, dict) else list(found or ())
        if found:
            return [_declared(row, finding) for finding in found]
    return []


# ---------------------------------------------------------------- putting the passes together

def _waiting_map(states: dict) -> dict:
    return {rank: rec for rank, rec in ((r, waiting_record(s)) for r, s in states.items()) if rec is not None}


def _members(states: dict, group: str, world_size: int) -> list:
    for state in states.values():
        ranks = (state.get("groups") or {}).get(group)
        if ranks is not None:
            return list(ranks)
    return list(range(world_size))


def proven_mismatches(states: dict, world_size: int) -> list:
    """[(group, parts)] for each group whose waiting ranks sit in calls that can never match one another."""
    waiting = {r: rec for r, rec in _waiting_map(states).items() if not rec.get("p2p")}
    by_group: dict = {}
    for rank, record in waiting.items():
        by_group.setdefault(record["group"], {})[rank] = record
    found = []
    for group, members_waiting in sorted(by_group.items()):
        parts = _partitions(members_waiting)
        if len({(rec["seq"], rec.get("api"), rec["op"], _shape_key(rec)) for _, rec in parts}) > 1:
            found.append((group, parts))
    return found


def classify(parts: list, states: dict, passes: tuple | None = None) -> list[Finding]:
    """The findings for one group whose waiting ranks can never match (its partitions, from proven_mismatches)."""
    return stage_findings(STAGE_MISMATCH, parts, states, passes=passes)


def fingerprint(states: dict) -> str:
    items = sorted((rank, rec["group"], rec["seq"], rec.get("api")) for rank, rec in _waiting_map(states).items())
    return hashlib.sha1(repr(items).encode()).hexdigest()[:16]


def _verdict(stage: Stage, findings: list, live: dict) -> Assessment:
    return Assessment(stage.verdict, findings, fingerprint(live) + stage.fingerprint_suffix)


def assess(states: dict[int, RankState], world_size: int, grace: float, timeout: float,
           silent: dict | None = None, passes: tuple | None = None) -> Assessment:
    """Decide from every rank's snapshot whether a hang is proven now, or a wait has outlasted the timeout.

    `silent`: {rank: {"silent_s", "process", "last_state", ...}} for ranks whose heartbeat stopped for longer than
    the watchdog's dead_after (or that never published); the watchdog measures that on its own clock. `passes`: the
    table to run, FINDING_PASSES unless given.
    """
    silent = silent or {}
    live = {r: s for r, s in states.items() if s.get("status") != S.EXITED and r not in silent}
    exited = {r for r, s in states.items() if s.get("status") == S.EXITED}
    blocked = {r for r, s in live.items() if is_blocked(s, grace)}
    if silent:  # nothing else is judged while a rank is silent: its last state may be stale
        found = stage_findings(STAGE_SILENT, silent, live, grace, passes=passes) if blocked else []
        return _verdict(STAGE_SILENT, found, live) if found else Assessment(None, [])
    if len(states) < world_size:
        return Assessment(None, [])  # a rank we cannot see may be the one that will unblock the rest
    if live and blocked == set(live):
        waiting = {r: waiting_record(live[r]) for r in blocked}
        found = stage_findings(STAGE_CROSSING, waiting, live, world_size, passes=passes)
        if found:
            return _verdict(STAGE_CROSSING, found, live)
        found = [f for _, parts in proven_mismatches(live, world_size) for f in classify(parts, live, passes)]
        if found:
            return _verdict(STAGE_MISMATCH, found, live)
    if exited and blocked:
        found = stage_findings(STAGE_EXITED, live, exited, grace, world_size, passes=passes)
        if found:
            return _verdict(STAGE_EXITED, found, live)
    if blocked:
        longest = max(waiting_record(live[r]).get("age_s", 0.0) for r in blocked)
        if longest >= timeout:
            found = stage_findings(STAGE_TIMEOUT, live, blocked, timeout, passes=passes)
            if found:
                return _verdict(STAGE_TIMEOUT, found, live)
    return Assessment(None, [])


def analyze(states: dict[int, RankState], world_size: int, grace: float, timeout: float,
            silent: dict | None = None) -> list[Finding]:
    """The findings for a finished incident document (re-run by `ddpwatch report`)."""
    return assess(states, world_size, grace, timeout, silent).findings
