"""What a Flight Recorder entry says in ddpwatch's words: its op, dtypes, and the DDP or c10d call its frames show.

Shared by the offline reader of dumps (sources/flight_recorder.py) and the live flight recorder (watch/flight.py);
plain data, no torch: a frame here is {"file", "line", "function", "internal"}, innermost first, as FR writes them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import catalogue
from .format import build

if TYPE_CHECKING:  # annotations only
    from .format.types import Site

DDP_FILE = re.compile(r"torch[/\\]nn[/\\]parallel[/\\]distributed\.py$")
C10D_FILE = re.compile(r"torch[/\\]distributed[/\\]distributed_c10d\.py$")
JOIN_FILE = re.compile(r"torch[/\\]distributed[/\\]algorithms[/\\]join\.py$")
FUNCOL_FILE = re.compile(r"torch[/\\]distributed[/\\]_functional_collectives\.py$")

DDP_BUFFER_SYNC_FUNCTIONS = {
    "_sync_buffers",
    "_sync_module_buffers",
    "_default_broadcast_coalesced",
    "_distributed_broadcast_coalesced",
}
OBJECT_COLLECTIVES = set(catalogue.object_collectives())
# The C++ Reducer's gradient all-reduce, issued from autograd hooks during backward() (named as ddpwatch's own
# recording names it, so the analysis treats both alike).
DDP_GRADIENT_ALLREDUCE = build.DDP_GRAD_ALLREDUCE
DDP_SYNC_MODULE_STATES = "_sync_module_states"

# c10d's scalar type names (as FR writes dtypes) -> torch dtype names (as ddpwatch writes them).
DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
}


def dtype(name) -> str:
    return DTYPES.get(str(name), str(name).lower())


def canonical_op(profiling_name) -> tuple:
    """'gloo:broadcast' -> ('broadcast', None); 'nccl:send 0->1' -> ('send', (0, 1))."""
    name = str(profiling_name or "?").split(":", 1)[-1].strip()
    peers = None
    match = re.search(r"(\d+)\s*->\s*(\d+)", name)
    if match:
        peers = (int(match.group(1)), int(match.group(2)))
    op = name.split()[0] if name.split() else "?"
    op = op.lstrip("_")
    return catalogue.canonical_op(op), peers


def first_user_frame(frames: list, start: int = 0) -> Site | None:
    """The innermost user frame at or outside `start`, as a site."""
    for frame in frames[start:]:
        if not frame["internal"]:
            return build.site(frame["file"], frame["line"], frame["function"])
    return None


def frame_index(frames: list, pattern, names=None) -> int | None:
    """The innermost frame whose file matches `pattern` (and whose function is one of `names`, if given)."""
    for index, frame in enumerate(frames):
        if pattern.search(frame["file"]) and (names is None or frame["function"] in names):
            return index
    return None


def classify(frames: list, op: str) -> tuple:
    """(api, region) for an op from its frames: DDP's buffer sync, bucket rebuild, gradient all-reduce, ..."""
    join_at = frame_index(frames, JOIN_FILE)
    if join_at is not None:  # torch's Join pairs unlike collectives on purpose (format/build.py: TORCH_JOIN)
        return c10d_api(frames, op), {
            "kind": build.TORCH_JOIN,
            "site": first_user_frame(frames, join_at + 1),
            "api": f"Join.{frames[join_at]['function']}",
        }
    forward_at = frame_index(frames, DDP_FILE, {"forward"})
    ddp_names = {f["function"] for f in frames if DDP_FILE.search(f["file"])}
    names = {f["function"] for f in frames}
    if forward_at is not None:
        region = {
            "kind": build.DDP_FORWARD,
            "site": first_user_frame(frames, forward_at + 1),
            "api": "DistributedDataParallel.forward",
        }
        innermost_ddp = frames[frame_index(frames, DDP_FILE) or 0]["function"]
        if ddp_names & DDP_BUFFER_SYNC_FUNCTIONS:
            return build.DDP_BUFFER_BROADCAST, region
        if innermost_ddp == "_pre_forward" and op == "broadcast":
            return build.DDP_BUCKET_REBUILD, region  # the C++ Reducer's rebuild, called from _pre_forward
        return c10d_api(frames, op), region
    if "_verify_param_shape_across_processes" in names:
        return build.DDP_VERIFY_PARAMS, None
    if names & {"_sync_module_states", "_sync_params_and_buffers"}:
        return DDP_SYNC_MODULE_STATES, None
    object_at = frame_index(frames, C10D_FILE, OBJECT_COLLECTIVES)
    if object_at is not None:
        api = frames[object_at]["function"]
        return c10d_api(frames, op), {
            "kind": build.OBJECT_COLLECTIVE,
            "site": first_user_frame(frames, object_at + 1),
            "api": api,
        }
    if frame_index(frames, C10D_FILE) is None and "_engine_run_backward" in names:
        return DDP_GRADIENT_ALLREDUCE, None
    funcol = [f["function"] for f in frames if FUNCOL_FILE.search(f["file"]) and not f["function"].startswith("_")]
    if funcol:  # a functional collective (DTensor's): named as the python recorder names it
        return f"funcol.{funcol[-1]}", None
    return c10d_api(frames, op), None


def c10d_api(frames: list, op: str) -> str:
    """The public torch.distributed function called: the outermost c10d frame (inner ones are helpers)."""
    c10d = [
        f["function"]
        for f in frames
        if C10D_FILE.search(f["file"])
        and not f["function"].startswith("_")
        and f["function"] not in OBJECT_COLLECTIVES
        and f["function"] != "wrapper"
    ]
    return c10d[-1] if c10d else op


def group_of(entry: dict) -> str:
    """The name of the process group an entry's op ran on (FR writes (name, description); older dumps a pg_id)."""
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return str(group[0])
    return str(group if group is not None else entry.get("pg_id", "0"))


def shapes_and_dtypes(entry: dict, limit: int) -> tuple:
    """([shape, ...], [dtype, ...]) of an entry's input tensors, at most `limit` of each, dtypes in torch's names
    ("float32", where FR writes "Float"): the one reading of them, live and offline."""
    shapes = [list(size) for size in entry.get("input_sizes") or () if isinstance(size, (list, tuple))][:limit]
    return shapes, [dtype(name) for name in entry.get("input_dtypes") or ()][:limit]


def thread_of(entry: dict) -> int | None:
    """The ident of the thread that issued the entry's op (FR writes threading.get_ident() as text)."""
    try:
        return int(entry.get("thread_id") or 0) or None
    except (TypeError, ValueError):
        return None


FINISHED_STATE = "completed"


def finished(entry: dict) -> bool:
    """Whether torch says an entry's op is done: `retired` once its Work finished (gloo leaves `state` at
    'scheduled' for completed ops), or `state` 'completed'. The one rule, live and offline."""
    return bool(entry.get("retired")) or entry.get("state") == FINISHED_STATE


def in_flight(entries: list) -> list:
    """The collectives' entries still in flight: not finished, less the stale ones (on gloo an async op whose Work
    nobody waited on is never retired, so an unfinished entry older than a finished one on its group is not)."""
    collectives = [entry for entry in entries if is_collective(entry)]
    newest_finished: dict = {}
    for entry in collectives:
        if finished(entry):
            group = group_of(entry)
            newest_finished[group] = max(newest_finished.get(group, 0), entry["collective_seq_id"])
    return [
        entry
        for entry in collectives
        if not finished(entry) and entry["collective_seq_id"] > newest_finished.get(group_of(entry), 0)
    ]


def is_collective(entry: dict) -> bool:
    """A collective's entry: a point-to-point op has no collective sequence number (the wrappers record those)."""
    return not entry.get("is_p2p") and bool(entry.get("collective_seq_id"))
