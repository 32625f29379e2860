"""The builders of the documents (a site, a record, a rank state, a finding) and the words they hold. No torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, cast

from .version import FORMAT_VERSION

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from .types import RankState, RecordDoc, Site

# Record states.
TENSORS_KEPT = 4  # the tensors a record keeps the shape and dtype of (the python recorder, FR entries alike)
IN_FLIGHT = "in_flight"
COMPLETED = "completed"
FAILED = "failed"
UNTRACKED = "untracked"  # dropped from the in-flight set after ring_size newer ops: its end was never seen

# Rank statuses.
RUNNING = "running"
EXITED = "exited"

# Region kinds: what the record happened inside of.
DDP_FORWARD = "ddp_forward"
OBJECT_COLLECTIVE = "object_collective"
FSDP_FORWARD = "fsdp_forward"  # FSDP2 (fully_shard): the pre-forward hook that all-gathers a module's parameters
# torch's Join context (DDP's model.join(), ZeroRedundancyOptimizer's, a custom Joinable's): the ranks that joined
# shadow the others' collectives with their own, unlike ones (a MAX of int64 against a SUM of float32), on purpose.
TORCH_JOIN = "torch_join"

# APIs through which DDP itself talks, and why (the fix text leans on these).
DDP_BUFFER_BROADCAST = "_broadcast_coalesced"
DDP_BUCKET_REBUILD = "Reducer._rebuild_buckets"
DDP_VERIFY_PARAMS = "_verify_params_across_processes"
# Not a Python call: the gradient all-reduce DDP's C++ Reducer runs inside backward(), recorded at the backward call.
DDP_GRAD_ALLREDUCE = "DDP.backward_all_reduce"
# A collective that Python never saw (compiled graph, torch.ops, C++), taken from the Flight Recorder's active entries.
FLIGHT_RECORDER_ONLY = "flight_recorder"
TRAINING_STEP_APIS = (DDP_BUFFER_BROADCAST, DDP_BUCKET_REBUILD, DDP_GRAD_ALLREDUCE)


def site(file: str, line: int | None, function: str) -> Site:
    return {"file": file, "line": line, "function": function}


def format_site(where: Mapping[str, Any] | None) -> str:
    if not where:
        return "an unknown line"
    return f"{where['file']}:{where['line']} in {where['function']}()"


def short_site(where: Mapping[str, Any] | None) -> str:
    """file basename:line, the way people name a line in conversation."""
    if not where:
        return "?"
    name = where["file"].replace("\\", "/").rsplit("/", 1)[-1]
    return f"{name}:{where['line']}"


# A record written without this key: Flight Recorder input has no `via` (the user's call is not known there).
ABSENT = object()


def record(
    seq,
    group: str,
    op: str,
    *,
    api,
    p2p: bool,
    peer,
    shapes: list,
    dtypes: list,
    site,
    via=ABSENT,
    region,
    start,
    age_s: float,
    duration_s,
    state: str,
    error,
    thread,
    **more,
) -> RecordDoc:
    """One collective as a rank issued it; `more`: the optional keys (types.RecordDoc), written after the others."""
    doc = {
        "seq": seq,
        "group": group,
        "op": op,
        "api": api,
        "p2p": p2p,
        "peer": peer,
        "shapes": shapes,
        "dtypes": dtypes,
        "site": site,
    }
    if via is not ABSENT:
        doc["via"] = via
    doc.update(region=region, start=start, age_s=age_s, duration_s=duration_s, state=state, error=error, thread=thread)
    doc.update(more)
    # Every key RecordDoc always has is set above; `more` holds optional ones by name. Built step by step so that
    # the keys are written in this order, `via` (when given) after `site`: a TypedDict literal could not leave it out.
    return cast("RecordDoc", doc)


def rank_state(
    rank: int,
    world_size: int,
    *,
    pid,
    host,
    beat,
    published_at,
    status: str,
    progress,
    idle_s: float,
    inflight: list,
    recent: list,
    last_seq: dict,
    groups: dict,
    ops_recorded,
    **more,
) -> RankState:
    """What one rank publishes (or what its Flight Recorder dump says); `more`: the optional keys (types.RankState),
    written after the others in the order given."""
    doc = {
        "format_version": FORMAT_VERSION,
        "rank": rank,
        "world_size": world_size,
        "pid": pid,
        "host": host,
        "beat": beat,
        "published_at": published_at,
        "status": status,
        "progress": progress,
        "idle_s": idle_s,
        "inflight": inflight,
        "recent": recent,
        "last_seq": last_seq,
        "groups": groups,
        "ops_recorded": ops_recorded,
    }
    doc.update(more)
    # Every key RankState always has is set above; `more` holds optional ones by name, in the order given.
    return cast("RankState", doc)
