"""Renders an incident as a Chrome trace (trace.json) for Perfetto, beside a PyTorch profiler trace; no torch."""

from __future__ import annotations

from ..format import build
from .wording import describe_op, rank_list, worded_incident

US = 1_000_000.0  # the trace event format counts microseconds


def incident_time(incident: dict) -> float | None:
    """When the incident was taken (epoch seconds): in-flight ops are drawn up to here."""
    return incident.get("created_at")


def _mismatch_roles(incident: dict) -> dict:
    """(rank, group, seq) -> 'culprit' or 'waiting', from each finding's side-by-side evidence."""
    roles = {}
    for finding in incident.get("findings") or ():
        culprits = set(finding.get("ranks") or ())
        for row in (finding.get("evidence") or {}).get("mismatched") or ():
            for rank in row.get("ranks") or ():
                roles[(rank, str(row.get("group")), row.get("seq"))] = "culprit" if rank in culprits else "waiting"
    return roles


def _thread_ids(records: list) -> dict:
    """Thread name -> small integer tid, the main thread first (tids must be numbers in this format)."""
    names = sorted({r.get("thread") or "MainThread" for r in records}, key=lambda n: (n != "MainThread", n))
    return {name: tid for tid, name in enumerate(names)}


def _site_text(where: dict | None) -> str | None:
    return build.format_site(where) if where else None


def _event_name(record: dict) -> str:
    api = record.get("api")
    return record["op"] if not api or api == record["op"] else f"{record['op']} [{api}]"


def _duration_us(record: dict, end: float | None) -> tuple:
    """(duration in us, whether it is known): in-flight ops last until the incident; unknown ends count as 0."""
    if record.get("state") == build.IN_FLIGHT:
        finish = end if end is not None else record["start"] + (record.get("age_s") or 0.0)
        return max(0.0, (finish - record["start"]) * US), True
    if record.get("duration_s") is not None:
        return record["duration_s"] * US, True
    return 0.0, False


def _record_event(rank: int, record: dict, tid: int, end: float | None, role: str | None) -> dict:
    duration, known = _duration_us(record, end)
    region = record.get("region") or {}
    args = {
        "group": record.get("group"),
        "seq": record.get("seq"),
        "op": record.get("op"),
        "api": record.get("api"),
        "state": record.get("state"),
        "shapes": record.get("shapes"),
        "dtypes": record.get("dtypes"),
        "site": _site_text(record.get("site")),
        "description": describe_op(record),
        "region": f"{region.get('kind')} at {_site_text(region.get('site'))}" if region else None,
        "peer": record.get("peer"),
        "error": record.get("error"),
    }
    if not known:
        args["duration_unknown"] = True
    if role:
        args["mismatch"] = role
    event = {
        "name": _event_name(record),
        "cat": "ddpwatch,p2p" if record.get("p2p") else "ddpwatch,collective",
        "ph": "X",
        "ts": round(record["start"] * US, 3),
        "dur": round(duration, 3),
        "pid": rank,
        "tid": tid,
        "args": {k: v for k, v in args.items() if v is not None},
    }
    if role:
        event["cname"] = "terrible" if role == "culprit" else "bad"  # colour hints for viewers that read them
    return event


def _metadata_events(rank: int, tids: dict) -> list:
    events = [
        {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
    ]
    events += [
        {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}}
        for name, tid in tids.items()
    ]
    return events


def _verdict_event(incident: dict, end: float) -> dict:
    findings = incident.get("findings") or []
    name = "; ".join(f"{f['kind']}: culprit {rank_list(f['ranks'])}" for f in findings) or "ddpwatch: no hang proven"
    return {
        "name": name,
        "cat": "ddpwatch,incident",
        "ph": "i",
        "s": "g",
        "ts": round(end * US, 3),
        "pid": incident.get("written_by") or 0,
        "tid": 0,
        "args": {
            "run_id": incident.get("run_id"),
            "trigger": incident.get("trigger"),
            "summaries": [f.get("summary") for f in findings],
        },
    }


def render_trace(incident: dict) -> dict:
    """The Chrome trace event format: one process per rank ("rank N"), one complete event per collective."""
    incident = worded_incident(incident)
    end = incident_time(incident)
    roles = _mismatch_roles(incident)
    events = []
    for state in incident.get("ranks") or ():
        rank = state["rank"]
        records = list(state.get("recent") or ()) + list(state.get("inflight") or ())
        tids = _thread_ids(records)
        events += _metadata_events(rank, tids)
        for record in sorted(records, key=lambda r: r.get("start") or 0.0):
            if record.get("start") is None:
                continue  # nothing to place on a time axis
            role = (
                roles.get((rank, str(record.get("group")), record.get("seq")))
                if record.get("state") == build.IN_FLIGHT
                else None
            )
            events.append(_record_event(rank, record, tids[record.get("thread") or "MainThread"], end, role))
    if end is not None:
        events.append(_verdict_event(incident, end))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "ddpwatch",
            "run_id": incident.get("run_id"),
            "format_version": incident.get("format_version"),
            "clock": "epoch microseconds, each rank's own clock",
        },
    }
