"""The iterators a rank's own code holds in its frames when an incident is taken, and whether each had run out.

Read on the watchdog thread, once per incident answer, from the main thread's live frames (as frameworks.py reads
them): nothing runs per batch or per collective. A loop left by a `break` over `batches = stream(shard)` leaves a
suspended generator behind; a loop whose data ran out leaves an exhausted one. That is observed, where the source
can only be read: the analysis (analysis/history.py) says which of the two a verdict rests on.
"""

from __future__ import annotations

import inspect
import itertools
import operator
import sys
import threading

MAX_ITERATORS = 16  # kept per rank, innermost frames first
NEVER_END = (itertools.count, itertools.cycle, itertools.repeat)


def main_thread_iterators(user_file) -> list:
    """[{"file", "function", "name", "kind", "ended", ...}] for the iterators held in locals of the main thread's
    user frames (`user_file(path)`: a frame of the user's code), innermost first; [] when there is nothing to read.
    Never raises: a reading that fails costs the evidence, not the incident."""
    try:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
    except Exception:  # noqa: BLE001 - evidence only
        return []
    found: list = []
    while frame is not None and len(found) < MAX_ITERATORS:
        try:
            if user_file(frame.f_code.co_filename):
                found += _in_frame(frame)
        except Exception:  # noqa: BLE001 - a local whose inspection fails is left out
            pass
        frame = frame.f_back
    return found[:MAX_ITERATORS]


def _in_frame(frame) -> list:
    where = {"file": frame.f_code.co_filename, "function": frame.f_code.co_name}
    seen = []
    for name, value in list(frame.f_locals.items()):
        described = describe(value)
        if described is not None:
            seen.append(dict(where, name=name, **described))
    return seen


def describe(value) -> dict | None:
    """{"kind", "ended", ...} for an iterator whose end can be read without advancing it; None for anything else."""
    if inspect.isgenerator(value):
        state = inspect.getgeneratorstate(value)
        if state == inspect.GEN_CREATED:
            return None  # never started: no loop ran over it
        doc = {"kind": f"generator {value.gi_code.co_name}()", "ended": state == inspect.GEN_CLOSED}
        if value.gi_frame is not None:
            doc["at_line"] = value.gi_frame.f_lineno
        return doc
    if isinstance(value, NEVER_END):
        return {"kind": f"itertools.{type(value).__name__}", "ended": False}
    yielded = getattr(value, "_num_yielded", None)
    if isinstance(yielded, int) and hasattr(value, "_index_sampler"):  # a DataLoader's iterator
        try:
            length = len(value)
        except Exception:  # noqa: BLE001 - an IterableDataset without a length
            return None
        return {"kind": "DataLoader iterator", "ended": yielded >= length, "yielded": yielded, "length": length}
    if type(value).__name__.endswith("iterator") and hasattr(value, "__length_hint__"):
        left = operator.length_hint(value, -1)
        return None if left < 0 else {"kind": type(value).__name__, "ended": left == 0, "left": left}
    return None
