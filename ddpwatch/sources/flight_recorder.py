"""Reads PyTorch Flight Recorder dumps (pickle or JSON, one per rank) as ddpwatch rank snapshots; no torch here.

The dump files themselves are found, read and checked by flight_recorder_files.py."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

from .. import frames as classifier  # frames: the one frame classifier
from ..analysis import incident, silent
from ..flight_entries import canonical_op, classify, finished, first_user_frame, group_of, shapes_and_dtypes
from ..format import build
from ..static import rankcond
from .flight_recorder_files import FlightRecorderError, find_dumps, parse_ranks

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import FingerprintDoc, Incident, IncidentSource, RankState, RecordDoc

RECENT_KEPT = 64


def _frame(raw: dict, chosen: classifier.Packages = classifier.NO_PACKAGES) -> dict:
    path = str(raw.get("filename") or raw.get("file") or "?")
    kind = classifier.classify(path, None, classifier.DUMPED, chosen)
    frame = {
        "file": path,
        "line": raw.get("line"),
        "function": str(raw.get("name") or raw.get("function") or "?"),
        "internal": kind != classifier.USER,
    }
    if kind == classifier.LIBRARY:
        frame["library"] = True  # as a live stack marks it
    return frame


def _ns(value) -> float | None:
    """FR's nanosecond times -> epoch seconds; 0 or None (gloo, JSON dumps) means unknown."""
    try:
        value = int(value)
    except (TypeError, ValueError):
        return None
    return value / 1e9 if value > 0 else None


def _record(entry: dict, rank: int, now: float, chosen: classifier.Packages = classifier.NO_PACKAGES) -> RecordDoc:
    op, peers = canonical_op(entry.get("profiling_name"))
    stack = [_frame(f, chosen) for f in entry.get("frames") or () if isinstance(f, dict)]
    api, region = classify(stack, op)
    p2p = bool(entry.get("is_p2p"))
    start = _ns(entry.get("time_created_ns")) or now
    completed_at = _ns(entry.get("time_discovered_completed_ns"))
    shapes, dtypes = shapes_and_dtypes(entry, build.TENSORS_KEPT)
    peer = None
    if p2p and peers:
        peer = peers[1] if peers[0] == rank else peers[0]
    return build.record(
        entry.get("p2p_seq_id") if p2p else entry.get("collective_seq_id"),
        group_of(entry),
        op,
        api=api,
        p2p=p2p,
        peer=peer,
        shapes=shapes,
        dtypes=dtypes,
        site=first_user_frame(stack),
        region=region,  # no `via`: a dump does not say which framework was called
        start=start,
        age_s=round(max(0.0, now - start), 4),
        duration_s=round(completed_at - start, 6) if completed_at else None,
        state=build.COMPLETED,  # decided per rank afterwards, see in_flight_ids
        error=None,
        thread=entry.get("thread_name") or "MainThread",
        # Kept for the in-flight decision and for people comparing with torch's own tools.
        fr={
            "record_id": entry.get("record_id"),
            "profiling_name": entry.get("profiling_name"),
            "state": entry.get("state"),
            "retired": entry.get("retired"),
            "frames": stack,
        },
    )


def _pg_desc(entry: dict) -> str:
    group = entry.get("process_group")
    return group[1] if isinstance(group, (list, tuple)) and len(group) > 1 else ""


# ---------------------------------------------------------------- which ops are still in flight


def _last_completed(dump: dict, group: str, pg_id) -> int | None:
    status = dump.get("pg_status") or {}
    for key in (group, str(pg_id)):
        value = (status.get(key) or {}).get("last_completed_collective") if isinstance(status, dict) else None
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def _torch_says_in_flight(record: dict, dump: dict, pg_id) -> bool | None:
    """What the dump itself says (True/False), or None when it says nothing usable.

    torch 2.13 marks an entry `retired` once its Work finished, and keeps each group's last completed sequence id
    in `pg_status`; both were right on gloo where `state` stays 'scheduled' for completed ops."""
    fr = record["fr"]
    if finished(fr):
        return False
    if isinstance(fr.get("retired"), bool):
        return True  # torch marks retirement, and has not marked this one
    if not record["p2p"] and record["seq"] is not None:
        last = _last_completed(dump, record["group"], pg_id)
        if last is not None and last >= 0:
            return record["seq"] > last
    return None


def decide_states(records_by_rank: dict, dumps: dict, members_of) -> dict:
    """rank -> the rule used; marks each record in_flight or completed in place.

    Rule: the dump's own completion marks when present; else (older or trimmed dumps) the heuristic below."""
    rules = {}
    heuristic = {}
    for rank, records in records_by_rank.items():
        dump = dumps[rank]
        pg_ids = {r["group"]: r["fr"].get("pg_id") for r in records}
        said = [_torch_says_in_flight(r, dump, pg_ids.get(r["group"])) for r in records]
        if records and all(s is not None for s in said):
            for record, in_flight in zip(records, said):
                record["state"] = build.IN_FLIGHT if in_flight else build.COMPLETED
            rules[rank] = "torch_completion_marks"
        else:
            heuristic[rank] = records
            rules[rank] = "unmatched_tail_heuristic"
    if heuristic:
        _unmatched_tail(heuristic, records_by_rank, members_of)
    return rules


def _unmatched_tail(to_decide: dict, records_by_rank: dict, members_of) -> None:
    """A collective completes only once every member rank joined it with the same op. So: an entry is in flight
    when some member rank holds no entry with the same op at that position of that group, judged only from
    the position where every member's ring buffer still reaches (older entries count as completed). In practice
    that is the last entry per rank per group, or the last two for DDP's coalesced buffer broadcast."""
    calls = {
        (rank, r["group"], r["seq"]): r["op"]
        for rank, records in records_by_rank.items()
        for r in records
        if not r["p2p"] and r["seq"] is not None
    }
    oldest: dict = {}
    for rank, group, seq in calls:
        oldest[(rank, group)] = min(seq, oldest.get((rank, group), seq))
    for records in to_decide.values():
        for record in records:
            record["state"] = build.COMPLETED  # p2p positions are per pair of ranks: left to the collectives' evidence
            if record["p2p"] or record["seq"] is None:
                continue
            members = members_of(record["group"])
            window = max((oldest.get((m, record["group"]), 0) for m in members), default=0)
            if record["seq"] >= window and any(
                calls.get((m, record["group"], record["seq"])) != record["op"] for m in members
            ):
                record["state"] = build.IN_FLIGHT


# ---------------------------------------------------------------- dumps -> rank snapshots


def group_members(dumps: dict) -> dict:
    """group name -> member ranks from pg_config (gloo writes the default group under an empty-string key)."""
    members: dict = {}
    for dump in dumps.values():
        config = dump.get("pg_config") or {}
        if not isinstance(config, dict):
            continue
        for key, entry in config.items():
            if not isinstance(entry, dict):
                continue
            ranks = parse_ranks(entry.get("ranks"))
            name = str(entry.get("name") or key)
            if ranks is not None and name:
                members.setdefault(name, ranks)
    return members


def _world_size(dumps: dict) -> int:
    """The default group holds every rank, so the largest group in pg_config (under whatever key: gloo writes an
    empty one) is the world; without pg_config, the highest rank seen."""
    sizes = [max(dumps) + 1]
    for dump in dumps.values():
        config = dump.get("pg_config") or {}
        for entry in config.values() if isinstance(config, dict) else ():
            ranks = parse_ranks(entry.get("ranks")) if isinstance(entry, dict) else None
            if ranks:
                sizes.append(max(len(ranks), max(ranks) + 1))
    return max(sizes)


def _groups_field(records: list[RecordDoc], members: dict, world_size: int) -> dict:
    """ddpwatch's `groups`: name -> member ranks, None for the default group."""
    out = {}
    for record in records:
        ranks = members.get(record["group"])
        default = record["group"] == "0" or record["fr"].get("desc") == "default_pg"
        out[record["group"]] = None if default or ranks is None or ranks == list(range(world_size)) else ranks
    return out


def _stacks(records: list[RecordDoc]) -> list:
    """FR has no thread stacks; the frames of the op this rank waits in are the closest thing (outermost first)."""
    from ..analysis import waiting_record

    # waiting_record reads a state's `inflight` only: a state of that one key is enough for it
    waiting = waiting_record(cast("RankState", {"inflight": [r for r in records if r["state"] == build.IN_FLIGHT]}))
    if waiting is None or not waiting["fr"]["frames"]:
        return []
    return [
        {
            "thread": waiting.get("thread"),
            "main": True,
            "frames": list(reversed(waiting["fr"]["frames"])),
            "source": "flight_recorder frames of the op in flight",
        }
    ]


def _snapshot(
    rank: int, world_size: int, records: list[RecordDoc], dump: dict, path: str, now: float, members: dict, rule: str
) -> RankState:
    inflight = [r for r in records if r["state"] == build.IN_FLIGHT]
    done = [r for r in records if r["state"] != build.IN_FLIGHT]
    # every record read from a dump has a start (_record: its creation time, else the dump's); the type allows None
    events = [r["start"] for r in records if r["start"] is not None] + [
        r["start"] + r["duration_s"] for r in done if r["start"] is not None and r["duration_s"]
    ]
    last_seq: dict = {}
    for r in records:
        if not r["p2p"] and r["seq"] is not None:
            last_seq[r["group"]] = max(last_seq.get(r["group"], -1), r["seq"])
    stacks = _stacks(records)
    groups = _groups_field(records, members, world_size)
    fingerprints = silent.fingerprints_of_records(done, rank)  # collectives completed without matching, too
    for r in records:
        r["fr"].pop("frames", None)  # the stack section carries them once; records stay small
        r["fr"].pop("desc", None)
    state = build.rank_state(
        rank,
        world_size,
        pid=None,
        host=None,
        beat=0,
        published_at=now,
        status=build.RUNNING,
        progress=len(records) + len(done),
        idle_s=round(max(0.0, now - max(events, default=now)), 4),
        inflight=sorted(inflight, key=lambda r: r["start"]),
        recent=done[-RECENT_KEPT:],
        last_seq={str(k): v for k, v in last_seq.items()},
        groups=groups,
        ops_recorded=len(records),
        stacks=stacks,
        source={
            "kind": "flight_recorder",
            "file": os.path.abspath(path),
            "fr_version": dump.get("version"),
            "in_flight_rule": rule,
        },
    )
    state["fingerprints"] = cast("FingerprintDoc", fingerprints)
    return state


def _dump_time(path: str, entries: list) -> float:
    """When the dump was taken: the file's modification time (FR writes no time of its own), never before its
    newest entry."""
    newest = max((_ns(e.get("time_created_ns")) or 0.0 for e in entries), default=0.0)
    return max(os.path.getmtime(path), newest)


def states_from_dumps(chosen: dict, packages: classifier.Packages = classifier.NO_PACKAGES) -> tuple:
    """({rank: snapshot}, world_size) from {rank: (dump, path)}; `packages`: the user_packages / library_packages
    options, where they are known."""
    dumps = {rank: dump for rank, (dump, _) in chosen.items()}
    members = group_members(dumps)
    records_by_rank, now_by_rank = {}, {}
    for rank, (dump, path) in sorted(chosen.items()):
        entries = sorted((e for e in dump["entries"] if isinstance(e, dict)), key=lambda e: e.get("record_id") or 0)
        now_by_rank[rank] = _dump_time(path, entries)
        records = [_record(e, rank, now_by_rank[rank], packages) for e in entries]
        for record, entry in zip(records, entries):
            record["fr"]["pg_id"] = entry.get("pg_id")
            record["fr"]["desc"] = _pg_desc(entry)
        records_by_rank[rank] = records
    world_size = _world_size(dumps)

    def members_of(group: str) -> list:
        ranks = members.get(group)
        if group == "0":
            ranks = list(range(world_size))
        elif ranks is None:  # a subgroup pg_config does not name: the ranks seen using it
            ranks = [rank for rank, records in records_by_rank.items() if any(r["group"] == group for r in records)]
        return [r for r in ranks if r in records_by_rank]  # a rank without a dump cannot be checked

    rules = decide_states(records_by_rank, dumps, members_of)
    states = {
        rank: _snapshot(
            rank,
            world_size,
            records_by_rank[rank],
            dumps[rank],
            chosen[rank][1],
            now_by_rank[rank],
            members,
            rules[rank],
        )
        for rank in records_by_rank
    }
    return states, world_size


def load_incident(
    folders: list,
    grace: float = incident.DEFAULT_GRACE,
    timeout: float = incident.DEFAULT_TIMEOUT,
    packages: classifier.Packages = classifier.NO_PACKAGES,
) -> Incident:
    """`ddpwatch report --flight-recorder DIR`: every dump under the folders, converted and analysed by ddpwatch."""
    chosen = find_dumps(folders)
    states, world_size = states_from_dumps(chosen, packages)
    bad = [rank for rank in states if rank >= world_size]
    if bad:
        raise FlightRecorderError(f"{chosen[bad[0]][1]}: rank {bad[0]} is outside the world size {world_size}")
    source: IncidentSource = {
        "kind": "flight_recorder",
        "files": [os.path.abspath(chosen[r][1]) for r in sorted(chosen)],
    }
    created = max(state["published_at"] for state in states.values())
    return incident.build(
        states,
        world_size,
        grace,
        timeout,
        source=source,
        created_at=created,
        rank_conditions=rankcond.capture_rank_conditions(states),
    )
