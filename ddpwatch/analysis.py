"""Turns rank snapshots into findings: small pure passes over plain data (no torch), one function per finding kind."""

from __future__ import annotations

import dataclasses
import hashlib

from . import snapshot as S

DEADLOCK = "deadlock"
TIMEOUT = "timeout"
DUMP = "dump"


@dataclasses.dataclass
class Assessment:
    """What the watchdog should do now: report a proven deadlock, report after the timeout, or nothing."""

    verdict: str | None
    findings: list
    fingerprint: str = ""


# ---------------------------------------------------------------- reading one rank's state

def waiting_record(state: dict) -> dict | None:
    """The op this rank waits on: its oldest collective still in flight (point-to-point only when nothing else)."""
    inflight = state.get("inflight") or []
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
    elif api == S.DDP_BUCKET_REBUILD:
        text += " for DDP's gradient bucket rebuild"
    elif api and api != record["op"]:
        text += f" ({api})"
    region = record.get("region")
    if region and region.get("kind") == S.DDP_FORWARD:
        return f"{text} inside DistributedDataParallel.forward called at {S.short_site(region.get('site'))}"
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
        else:
            waits, where = [0.0], "exited"
        out.append({"ranks": ranks, "state": key[0], "where": where, "wait_s": round(max(waits), 1),
                    "record": record})
    out.sort(key=lambda g: (-len(g["ranks"]), g["ranks"][0]))
    return out


# ---------------------------------------------------------------- the passes

def _partitions(waiting: dict) -> list:
    """Ranks waiting on one group split by what they wait in: [(ranks, record)], one per distinct call."""
    parts: dict = {}
    for rank, record in sorted(waiting.items()):
        region = record.get("region") or {}
        key = (record["seq"], record.get("api"), record["op"], S.short_site(record.get("site")),
               region.get("kind"), S.short_site(region.get("site")))
        parts.setdefault(key, ([], record))[0].append(rank)
    return list(parts.values())


def _seen_by_all(site: dict | None, states: dict, ranks) -> bool:
    """Whether every given rank has issued a collective from this line before (so it is a normal sync point)."""
    if not site:
        return False
    for rank in ranks:
        history = states[rank].get("recent") or []
        if not any((r.get("site") or {}).get("file") == site["file"] and (r.get("site") or {}).get("line") == site["line"]
                   for r in history):
            return False
    return True


def _innocent_partition(parts: list, states: dict):
    """The partition that waits where the program expects everyone: a barrier, the majority, or a familiar line."""
    if len(parts) < 2:
        return None, ""
    sizes = sorted((len(ranks) for ranks, _ in parts), reverse=True)
    if sizes[0] > sizes[1]:
        return max(parts, key=lambda p: len(p[0])), "majority"
    barriers = [p for p in parts if p[1]["op"] == "barrier"]
    if len(barriers) == 1:
        return barriers[0], "barrier"
    all_ranks = [r for ranks, _ in parts for r in ranks]
    familiar = [p for p in parts if _seen_by_all(p[1].get("site"), states, all_ranks)]
    if len(familiar) == 1:
        return familiar[0], "history"
    return None, ""


def _side_by_side(parts: list) -> list:
    return [{"ranks": ranks, "group": rec["group"], "seq": rec["seq"], "op": rec["op"], "api": rec.get("api"),
             "shapes": rec.get("shapes"), "dtypes": rec.get("dtypes"), "site": rec.get("site"),
             "region": rec.get("region"), "wait_s": rec.get("age_s"), "description": describe_op(rec)}
            for ranks, rec in parts]


def ddp_forward_on_subset(parts: list, states: dict) -> dict | None:
    inside = [p for p in parts if (p[1].get("region") or {}).get("kind") == S.DDP_FORWARD]
    outside = [p for p in parts if p not in inside]
    if not inside or not outside:
        return None
    culprits = sorted(r for ranks, _ in inside for r in ranks)
    others = sorted(r for ranks, _ in outside for r in ranks)
    record = inside[0][1]
    call_site = user_location(record)
    rebuild = record.get("api") == S.DDP_BUCKET_REBUILD
    if rebuild:
        why = ("DDP rebuilds its gradient buckets once, on the first grad-enabled forward after the first backward, "
               "and that rebuild broadcasts across all ranks")
        short_why = "the one-time gradient bucket rebuild in DDP.forward is a broadcast every rank must join"
    else:
        why = ("DDP's forward broadcasts the module's buffers (such as BatchNorm running statistics) from rank 0 "
               "to every rank before computing, so every rank must run it")
        short_why = "DDP.forward's buffer broadcast (BatchNorm statistics) needs every rank"
    waiting_where = "; ".join(f"{rank_list(r)} {_verb(r, 'waits', 'wait')} in {describe_op(rec)}" for r, rec in outside)
    summary = (f"{_sentence(rank_list(culprits))} called the DistributedDataParallel model at "
               f"{S.short_site(call_site)} ({S.format_site(call_site)}) while {rank_list(others)} did not: "
               f"{why}. {_sentence(rank_list(culprits))} {_verb(culprits, 'blocks', 'block')} in {describe_op(record)}; {waiting_where}. "
               "Neither side can ever finish.")
    fix = (f"For rank-local work (evaluation, logging) call the wrapped module directly: `model.module(x)` instead of "
           f"`model(x)` at {S.short_site(call_site)}; or run that forward on every rank ({short_why}).")
    return S.finding("ddp_forward_on_subset", culprits, summary, fix, call_site,
                     {"ddp_op": "bucket_rebuild" if rebuild else "buffer_broadcast",
                      "mismatched": _side_by_side(parts)})


def collective_on_subset_or_mismatch(parts: list, states: dict) -> dict:
    innocent, reason = _innocent_partition(parts, states)
    side = _side_by_side(parts)
    if innocent is None:
        ranks = sorted(r for ranks, _ in parts for r in ranks)
        record = parts[0][1]
        calls = "; ".join(f"{rank_list(r)}: {describe_op(rec)} (seq {rec['seq']})" for r, rec in parts)
        summary = (f"The ranks issued different collectives at the same point of group {record['group']}: {calls}. "
                   "They can never match.")
        fix = ("Make every rank issue the same collectives in the same order on each process group; look for a "
               "branch on rank, data or configuration that changes which collective runs.")
        return S.finding("collective_mismatch", ranks, summary, fix, user_location(record),
                         {"mismatched": side, "culprit_rule": "none"})
    culprit_parts = [p for p in parts if p is not innocent]
    culprits = sorted(r for ranks, _ in culprit_parts for r in ranks)
    record = culprit_parts[0][1]
    expected = innocent[1]
    location = user_location(record)
    summary = (f"{_sentence(rank_list(culprits))} called {describe_op(record)} ({S.format_site(location)}), "
               f"which {rank_list(innocent[0])} {_verb(innocent[0], 'does', 'do')} not call at this point: "
               f"{_verb(innocent[0], 'it waits', 'they wait')} in {describe_op(expected)}. "
               f"Neither side can ever finish.")
    fix = (f"Run the collective at {S.short_site(location)} on every rank of the group (move it out of any "
           f"rank-only branch), or give it a process group made of only the ranks that call it "
           f"(`dist.new_group(ranks=...)`).")
    return S.finding("collective_on_subset", culprits, summary, fix, location,
                     {"mismatched": side, "culprit_rule": reason})


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


def _waiting_map(states: dict) -> dict:
    return {rank: waiting_record(state) for rank, state in states.items() if waiting_record(state) is not None}


def _members(states: dict, group: str, world_size: int) -> list:
    for state in states.values():
        ranks = (state.get("groups") or {}).get(group)
        if ranks is not None:
            return list(ranks)
    return list(range(world_size))


def proven_mismatches(states: dict, world_size: int) -> list:
    """[(group, parts)] for each group whose waiting ranks sit in calls that can never match one another."""
    waiting = _waiting_map(states)
    by_group: dict = {}
    for rank, record in waiting.items():
        by_group.setdefault(record["group"], {})[rank] = record
    found = []
    for group, members_waiting in sorted(by_group.items()):
        parts = _partitions(members_waiting)
        if len({(rec["seq"], rec.get("api"), rec["op"]) for _, rec in parts}) > 1:
            found.append((group, parts))
    return found


def fingerprint(states: dict) -> str:
    items = sorted((rank, rec["group"], rec["seq"], rec.get("api")) for rank, rec in _waiting_map(states).items())
    return hashlib.sha1(repr(items).encode()).hexdigest()[:16]


def assess(states: dict, world_size: int, grace: float, timeout: float) -> Assessment:
    """Decide from every rank's snapshot whether a deadlock is proven now, or a wait has outlasted the timeout."""
    if len(states) < world_size:
        return Assessment(None, [])  # a rank we cannot see may be the one that will unblock the rest
    live = {r: s for r, s in states.items() if s.get("status") != S.EXITED}
    blocked = {r for r, s in live.items() if is_blocked(s, grace)}
    if live and blocked == set(live):
        mismatches = proven_mismatches(live, world_size)
        if mismatches:
            findings = [ddp_forward_on_subset(parts, live) or collective_on_subset_or_mismatch(parts, live)
                        for _, parts in mismatches]
            return Assessment(DEADLOCK, findings, fingerprint(live))
    if blocked:
        longest = max(waiting_record(live[r]).get("age_s", 0.0) for r in blocked)
        if longest >= timeout:
            found = straggler(live, blocked, timeout)
            if found:
                return Assessment(TIMEOUT, [found], fingerprint(live))
    return Assessment(None, [])


def analyze(states: dict, world_size: int, grace: float, timeout: float) -> list:
    """The findings for a finished incident document (re-run by `ddpwatch report`)."""
    return assess(states, world_size, grace, timeout).findings
