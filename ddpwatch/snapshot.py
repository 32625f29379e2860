"""The versioned, plain-data formats ddpwatch writes and reads: rank snapshots, findings, incidents. No torch here."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from .shapes import Site

# What each format version changed (bump on any change a reader must know about):
#   1: first version: rank snapshots (records, stacks), incidents with findings.
FORMAT_VERSION = 1
READABLE_VERSIONS = (1,)

# Record states.
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

# APIs through which DDP itself talks, and why (the fix text leans on these).
DDP_BUFFER_BROADCAST = "_broadcast_coalesced"
DDP_BUCKET_REBUILD = "Reducer._rebuild_buckets"
DDP_VERIFY_PARAMS = "_verify_params_across_processes"
# Not a Python call: the gradient all-reduce DDP's C++ Reducer runs inside backward(), recorded at the backward call.
DDP_GRAD_ALLREDUCE = "DDP.backward_all_reduce"
# A collective that Python never saw (compiled graph, torch.ops, C++), taken from the Flight Recorder's active entries.
FLIGHT_RECORDER_ONLY = "flight_recorder"
TRAINING_STEP_APIS = (DDP_BUFFER_BROADCAST, DDP_BUCKET_REBUILD, DDP_GRAD_ALLREDUCE)


class FormatError(ValueError):
    """A file or document that is not a ddpwatch snapshot or incident this version can read."""


def site(file: str, line: int, function: str) -> Site:
    return {"file": file, "line": line, "function": function}


def format_site(where: dict | None) -> str:
    if not where:
        return "an unknown line"
    return f"{where['file']}:{where['line']} in {where['function']}()"


def short_site(where: dict | None) -> str:
    """file basename:line, the way people name a line in conversation."""
    if not where:
        return "?"
    name = where["file"].replace("\\", "/").rsplit("/", 1)[-1]
    return f"{name}:{where['line']}"


def check_version(doc: Any, what: str) -> dict:
    if not isinstance(doc, dict):
        raise FormatError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    version = doc.get("format_version")
    if version not in READABLE_VERSIONS:
        raise FormatError(
            f"{what}: format_version {version!r} is not one this ddpwatch reads ({', '.join(map(str, READABLE_VERSIONS))})"
        )
    return doc


def load_json_text(text: str, what: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{what}: not valid JSON ({exc})") from None
    return check_version(doc, what)


# What json.loads builds, per token, as measured on CPython 3.11 (a dict with keys 224 bytes, a list 56 + 8 a
# slot, a number or string about 48 with its slot); counted in the raw bytes, strings included (an overcount).
JSON_TOKEN_COST = ((b"{", 240), (b"[", 72), (b",", 48))


def json_build_estimate(data: bytes) -> int:
    """Bytes of memory json.loads would build from `data`, estimated at C speed before parsing (files, the store)."""
    return sum(cost * data.count(token) for token, cost in JSON_TOKEN_COST)


def dumps(doc: dict) -> str:
    """Serialise a snapshot or incident; anything not JSON-native becomes its repr rather than an error."""
    return json.dumps(doc, default=repr, sort_keys=False, indent=None, separators=(",", ":"))
