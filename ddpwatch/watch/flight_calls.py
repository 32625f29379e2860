"""The Flight Recorder's entries folded to one per library call, where the python recorder records one record."""

from __future__ import annotations

import bisect

from .. import flight_entries
from ..flight_entries import group_of, is_collective, thread_of

# A call's window as the Recorder keeps it (capture/record.py, call_window): (thread ident, start ns, end ns or
# None while the call is still running), on the system clock, the one the Flight Recorder's time_created_ns uses.


def fold(entries: list, calls: list) -> list:
    """`entries` (the Flight Recorder's, oldest first) with the collectives that one library call issued on one group
    merged into the first of them (merged()): DDP's buffer broadcast is one broadcast per bucket in the Flight
    Recorder and one record in the python recorder. An entry belongs to a call when its thread issued it inside the
    call's window (`calls`, the Recorder's call_windows()). Everything else passes through as it came, the same
    dict: a user's own loop of collectives, two calls one after the other, point-to-point entries."""
    windows = _windows_by_thread(calls)
    if not windows:
        return list(entries)
    folded: list = []
    members: dict = {}  # (thread, call start, group) -> the entries of that call on that group
    for entry in entries:
        call = _call_of(entry, windows)
        if call is None:
            folded.append(entry)
            continue
        key = (*call, group_of(entry))
        if key not in members:
            members[key] = [entry]
            folded.append(key)  # a placeholder, where the call's first entry stood
        else:
            members[key].append(entry)
    return [merged(members[item]) if isinstance(item, tuple) else item for item in folded]


def merged(entries: list) -> dict:
    """One entry for the ops of one call: the first one's (its sequence number, op, time, frames), with every op's
    tensors, finished only once all of them are. A single entry comes back as it is."""
    if len(entries) == 1:
        return entries[0]
    first = dict(entries[0])
    first["input_sizes"] = [size for entry in entries for size in entry.get("input_sizes") or ()]
    first["input_dtypes"] = [name for entry in entries for name in entry.get("input_dtypes") or ()]
    first["folded_ops"] = len(entries)
    running = [entry for entry in entries if not flight_entries.finished(entry)]
    first["retired"] = not running
    first["state"] = flight_entries.FINISHED_STATE if not running else running[0].get("state")
    return first


def _windows_by_thread(calls: list) -> dict:
    """thread -> (starts, ends) sorted by start; a call seen both open and finished (read while it closed) is
    kept finished."""
    by_key: dict = {}
    for call in calls:
        try:
            thread, start, end = int(call[0]), int(call[1]), call[2]
        except (TypeError, ValueError, IndexError):
            continue  # the watchdog reads what the training thread writes: never trust the shape
        if end is None and (thread, start) in by_key:
            continue
        by_key[(thread, start)] = None if end is None else int(end)
    windows: dict = {}
    for (thread, start), end in sorted(by_key.items()):
        starts, ends = windows.setdefault(thread, ([], []))
        starts.append(start)
        ends.append(end)
    return windows


def _call_of(entry: dict, windows: dict) -> tuple | None:
    """(thread, start) of the call whose window holds the entry's creation on its thread; None for a point-to-point
    entry (the wrappers record those) or one outside every call."""
    if not is_collective(entry):
        return None
    thread, created = thread_of(entry), entry.get("time_created_ns")
    if thread not in windows or not isinstance(created, int):
        return None
    starts, ends = windows[thread]
    index = bisect.bisect_right(starts, created) - 1  # calls on one thread do not overlap: the outermost is kept
    if index < 0:
        return None
    end = ends[index]
    return (thread, starts[index]) if end is None or created <= end else None
