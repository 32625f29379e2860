"""Whether torch's Flight Recorder can be a rank's record here: torch's API, the buffer's size, the symbolizer, the
default group's backend. Each check says why not, or None."""

from __future__ import annotations

import os
import pickle
import sys

DEFAULT_BUFFER = 2000  # the Flight Recorder's entries when TORCH_FR_BUFFER_SIZE is not set (torch 2.13)
# The backends whose every collective lands in the Flight Recorder read here (_dump_fr_trace: torch's generic
# FlightRecorder<c10::Event>). NCCL records into a recorder of its own (FlightRecorderCUDA, read by _dump_nccl_trace
# on CUDA builds; torch's FlightRecorderCuda.cpp), which this feed does not read and no GPU here could check: an
# NCCL job read through _dump_fr_trace would be seen to progress and found in no collective at all.
SERVED_BACKENDS = frozenset({"gloo"})


def read_dump(stack_traces: bool = False, only_active: bool = False, nccl: bool = True) -> dict | None:
    """This process's Flight Recorder, as one dump: torch's generic recorder (gloo and the others) and, where a CUDA
    build has it and `nccl`, NCCL's own (_dump_nccl_trace), their entries and group statuses together (the entries
    are alike: flight_entries.py reads both). None when neither can be read; never raises. The one live reader:
    the feed, the report's tail and the collectives Python never saw all read through it."""
    try:
        import torch._C._distributed_c10d as c10d_c
    except Exception:
        return None
    readers = ["_dump_fr_trace"] + (["_dump_nccl_trace"] if nccl else [])
    merged: dict | None = None
    for name in readers:
        reader = getattr(c10d_c, name, None)
        if reader is None:
            continue
        try:
            dump = pickle.loads(reader(True, stack_traces, only_active))  # our own process's dump: not hostile input
        except Exception:
            continue
        if not isinstance(dump, dict):
            continue
        if merged is None:
            merged = dict(dump, entries=list(dump.get("entries") or ()), pg_status=dict(dump.get("pg_status") or {}))
        else:
            merged["entries"] += list(dump.get("entries") or ())
            merged["pg_status"].update(dump.get("pg_status") or {})
    return merged


def read_status() -> dict | None:
    """The generic recorder's per-group status (pg_status) alone, from a dump of its header: no entries, about 12 us
    (the feed's gloo groups; NCCL's recorder is not the feed's). None when it cannot be read."""
    try:
        import torch._C._distributed_c10d as c10d_c

        header = pickle.loads(c10d_c._dump_fr_trace(False, False, False))  # type: ignore[attr-defined]
    except Exception:
        return None
    return header.get("pg_status") if isinstance(header, dict) else None


def unavailable() -> str | None:
    """Why torch's Flight Recorder cannot be the record here, or None when it can."""
    try:
        import torch._C._distributed_c10d as c10d_c
        import torch.distributed as dist
    except Exception as exc:
        return f"torch.distributed cannot be imported ({type(exc).__name__})"
    if not hasattr(c10d_c, "_dump_fr_trace") or not hasattr(dist.ProcessGroup, "_get_sequence_number_for_group"):
        return f"torch {getattr(sys.modules.get('torch'), '__version__', '?')} has no Flight Recorder to read"
    for variable, size in _buffer_settings():
        if size <= 0:
            return f"{variable}={size} turns the Flight Recorder off"
    return None


def _buffer_settings() -> list:
    """(variable, entries) for each of torch's buffer-size variables set to a whole number, the current name first."""
    settings = []
    for variable in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        size = os.environ.get(variable, "").strip()
        if size and size.lstrip("-").isdigit():
            settings.append((variable, int(size)))
    return settings


def buffer_size() -> int:
    """How many entries the Flight Recorder keeps, all groups together (its buffer is one ring per process)."""
    settings = _buffer_settings()
    return settings[0][1] if settings else DEFAULT_BUFFER


def load_symbolizer() -> str | None:
    """Import what torch's traceback symbolizer imports on its first use, here, on the thread that arms the session
    (the program's own, inside init_process_group); or why that failed. A read with stack traces imports
    torch._inductor.codecache (0.9 s and 76 MB in a process that imported only torch; a few hundredths of a second
    where a torch.optim optimizer already imported torch._inductor, measured): from the watchdog thread, that
    import raced the program's own lazy import of torch._dynamo (an ImportError in the program, seen on a
    torch.ops call). Imported first, no read ever imports anything."""
    try:
        import torch._inductor.codecache  # noqa: F401  (what py_symbolize imports: generated code's lines)
    except Exception as exc:
        return f"torch's traceback symbolizer cannot be loaded ({type(exc).__name__}: {exc})"[:300]
    return None


def backend_unsupported(pg) -> str | None:
    """Why the Flight Recorder read here does not hold this group's collectives, or None: a backend other than gloo
    (the fake and custom ones record nothing and count no sequence numbers; NCCL's go to its own recorder)."""
    try:
        import torch.distributed as dist

        backend = str(dist.get_backend(pg)).lower()
    except Exception as exc:
        return f"its backend cannot be read ({type(exc).__name__})"
    names = {part.split(":")[-1].strip() for part in backend.split(",")}  # "cpu:gloo,cuda:nccl"
    if names <= SERVED_BACKENDS:
        return None
    if "nccl" in names:
        return (
            f"the {backend} backend: NCCL's collectives go to its own Flight Recorder, which the flight feed does "
            "not read (the report's evidence does: docs/how-it-works.md, the two recorders)"
        )
    return f"the {backend} backend is not recorded by the Flight Recorder"


def why_not_here() -> str | None:
    """The first reason the Flight Recorder cannot be this rank's record, checked cheapest first (the symbolizer's
    import, the one that costs, last), or None."""
    return unavailable() or backend_unsupported(None) or load_symbolizer()
