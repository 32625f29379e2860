"""Under the flight recorder, the reduce op a collective was given: the one fact of a collective it does not keep."""

# A rank that reduces with MAX where the others SUM completes every collective and computes wrong numbers
# (analysis/silent.py). The Flight Recorder writes "all_reduce" either way, so the reducing collectives keep a thin
# wrapper: for the default SUM it only calls through (a test and a call, no record); any other op leaves a note,
# [thread, start, end, op], that the flight recorder's reads match with the entry created on that thread meanwhile.
# The note is written before the call and its end filled in after: a look made while the rank waits inside the
# call (its entry in flight) must find the op already. Written only at the end, it was missing then, the op read as
# SUM, and the record kept it once completed: a false silent_mismatch (MIN against SUM) under the suite's load.

from __future__ import annotations

import collections
import inspect
import threading
import time

from .. import catalogue

NOTES_KEPT = 256  # the newest non-SUM calls remembered: the watchdog reads them within a round or two


class ReduceNotes:
    """The reducing calls made with an op other than SUM, newest last; written by training threads (deque appends
    are atomic), read by the watchdog thread."""

    def __init__(self):
        self._notes: collections.deque = collections.deque(maxlen=NOTES_KEPT)

    def add(self, ident: int, started_ns: int, ended_ns: int | None, op) -> list:
        """Note a call; `ended_ns` None while it runs (the caller sets the note's [2] when it returns)."""
        note = [ident, started_ns, ended_ns, op]
        self._notes.append(note)
        return note

    def op_of(self, ident: int | None, created_ns: int):
        """The op of the call on thread `ident` that was running at `created_ns` (when torch created the Flight
        Recorder entry), or None: it was called with the default, SUM."""
        for thread, started, ended, op in reversed(list(self._notes)):
            if thread == ident and started <= created_ns and (ended is None or created_ns <= ended):
                return op
        return None


def install(patches, notes: ReduceNotes) -> None:
    """Wrap the reducing collectives under torch.distributed.X and distributed_c10d.X (internal calls use the
    latter), through the Patcher's Patches: undone with them, and never twice."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in catalogue.reducing_collectives():
        patches.wrap_public(dist, c10d, name, lambda original: reduce_op_wrapper(original, notes))


def reduce_op_wrapper(original, notes: ReduceNotes):
    """`original` (a collective with an `op` parameter), noting a call made with another op than SUM."""
    from torch.distributed import ReduceOp

    position = list(inspect.signature(original).parameters).index("op")
    default, time_ns, get_ident = ReduceOp.SUM, time.time_ns, threading.get_ident

    def wrapper(*args, **kwargs):
        op = args[position] if len(args) > position else kwargs.get("op", default)
        if op is default:  # the common case: nothing more than the call
            return original(*args, **kwargs)
        note = notes.add(get_ident(), time_ns(), None, op)  # before the call: a look meanwhile finds it
        try:
            return original(*args, **kwargs)
        finally:
            note[2] = time_ns()

    return wrapper
