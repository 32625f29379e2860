"""Each rank's own history: the positions it passed (did it ever go from here to there?) and its DataLoader epochs."""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..format import build
from .reading import user_location

NEW = "new"  # the rank's last move is one it never made before, from a position it knows
FAMILIAR = "familiar"  # the rank made this very move before


# ---------------------------------------------------------------- positions: the user's line and what was called there


def position(record: Mapping[str, Any]) -> tuple:
    site = user_location(record)
    file, line = (site.get("file"), site.get("line")) if site else (None, None)
    return (file, line, record.get("api") or record.get("op"))


def path(state: dict, current: Mapping[str, Any]) -> list:
    """The records of the thread that waits in `current`, oldest first, ending with `current`; a finished `current`
    (where a rank that went on was at the others' position) ends it there."""
    thread = current.get("thread")
    done: list[Mapping[str, Any]] = [
        r
        for r in state.get("recent") or ()
        if isinstance(r, dict) and not r.get("p2p") and r.get("state") == build.COMPLETED and r.get("thread") == thread
    ]
    if current in done:
        done = done[: done.index(current)]
    return done + [current]


def _moves(records: list) -> set:
    """Every move between two consecutive positions before the last one."""
    keys = [position(r) for r in records[:-1]]
    return set(zip(keys, keys[1:]))


def turn(records: list) -> str | None:
    """NEW, FAMILIAR, or None (too little history to say): whether the last move was made before."""
    if len(records) < 3:
        return None
    last, now = position(records[-2]), position(records[-1])
    if (last, now) in _moves(records):
        return FAMILIAR
    if any(position(r) == last for r in records[:-2]):
        return NEW
    return None


def went_on_to(records: list, record: Mapping[str, Any]) -> bool:
    """Whether, earlier, this rank went from its last finished position to where `record` was called."""
    return (position(records[-2]), position(record)) in _moves(records) if len(records) >= 2 else False


# ---------------------------------------------------------------- DataLoader epochs (capture/loaders.py)


def _training_loader(state: dict) -> dict | None:
    """The DataLoader that ran the rank's training steps (the most of them), as its state has it."""
    best = None
    for entry in state.get("epochs") or ():
        if not isinstance(entry, dict) or not _counts(entry):
            continue
        steps = entry["steps"]
        if sum(steps) > 0 and (best is None or sum(steps) > sum(best["steps"])):
            best = entry
    return best


def _counts(entry: dict) -> bool:
    steps, length = entry.get("steps"), entry.get("length")
    return (
        isinstance(entry.get("epochs"), int)
        and isinstance(steps, list)
        and 0 < len(steps) <= entry["epochs"]
        and all(isinstance(n, int) and not isinstance(n, bool) for n in steps)
        and (length is None or isinstance(length, int) and not isinstance(length, bool))
    )


def _by_epoch(loader: dict) -> dict:
    """{epoch number (from 1): DDP steps in it} for the epochs the state kept."""
    first = loader["epochs"] - len(loader["steps"]) + 1
    return {first + index: steps for index, steps in enumerate(loader["steps"])}


def _began_more(mine: dict, theirs: list) -> dict | None:
    """The others began an epoch this rank never began, after the same steps in every epoch both ran."""
    own = _by_epoch(mine)
    for other in theirs:
        common = [e for e in _by_epoch(other) if e in own]
        if other["epochs"] <= mine["epochs"] or not common or any(_by_epoch(other)[e] != own[e] for e in common):
            return None
    return {
        "rule": "began_more",
        "epochs": mine["epochs"],
        "steps": sorted(set(own.values())),
        "others_epochs": min(o["epochs"] for o in theirs),
    }


def _short_last_epoch(mine: dict, theirs: list) -> dict | None:
    """The same epoch on every rank, the same steps in the earlier ones, and this rank's last one cut short."""
    own = _by_epoch(mine)
    last = mine["epochs"]
    earlier = {own[e] for e in own if e < last}
    if len(earlier) != 1 or own[last] >= min(earlier):
        return None
    for other in theirs:
        theirs_by_epoch = _by_epoch(other)
        if other["epochs"] != last or any(theirs_by_epoch.get(e, n) != n for e, n in own.items() if e < last):
            return None
    return {"rule": "short_last_epoch", "epochs": last, "steps": sorted(earlier), "last_steps": own[last]}


def _equal_lengths(mine: dict, theirs: list) -> dict | None:
    """Every rank's DataLoader yields as many batches per epoch, and every rank is in the same epoch: it cannot have
    run out on this rank first."""
    length = mine.get("length")
    if length is None or any(o.get("length") != length or o["epochs"] != mine["epochs"] for o in theirs):
        return None
    return {"rule": "equal_lengths", "length": length, "epochs": mine["epochs"]}


def epochs_say_left_early(rank: int, others: list, states: dict) -> dict | None:
    """What the DataLoader epochs say against data that ran out: the others began an epoch this rank did not, with
    equal steps per epoch until then; or this rank's last epoch is shorter than its earlier ones (which match the
    others'); or every rank's DataLoader has as many batches and they are in the same epoch. None: no DataLoader, or
    the counts do not say it (different steps per epoch or lengths: uneven data)."""
    mine = _training_loader(states[rank])
    theirs = [_training_loader(states[r]) for r in others]
    if mine is None or any(t is None for t in theirs):
        return None
    return _began_more(mine, theirs) or _short_last_epoch(mine, theirs) or _equal_lengths(mine, theirs)


def left_with_data(site, leavers: list, states: dict) -> dict | None:
    """Why `leavers` did not leave the loops around the training step at `site` because their data ran out, or None:
    one of those loops ends only by an exit (`while True:`, a `for` over `itertools.cycle` or a generator that never
    returns: read from the source, in the ranks' `code`), unless its exit is `except StopIteration`; or every leaver
    still holds, not run out, the iterator a loop runs over (observed, iterator_not_ended). The other proofs (counted
    loops, the DataLoader epochs) are departure.py's, which needs the exit too."""
    if not site:
        return None
    loops = _loops_around(site, states)
    if any(loop.get("endless") is True and not _left_when_exhausted(loop) for loop in loops):
        return {"rule": "endless", "basis": "source", "loops": [loop.get("text") for loop in loops]}
    found = [iterator_not_ended(rank, loops, states, site.get("file")) for rank in leavers]
    return found[0] if found and all(found) else None


def _left_when_exhausted(loop: dict) -> bool:
    """`while True:` around `next(it)` with `except StopIteration: break`: its data ending is how it ends."""
    return any(
        isinstance(e, dict) and ((e.get("handler") or {}).get("exhausted") is True) for e in loop.get("exits") or ()
    )


def _loops_around(site, states: dict) -> list:
    key = f"{site.get('file')}:{site.get('line')}"
    for state in states.values():
        around = ((state or {}).get("code") or {}).get(key)
        if isinstance(around, dict) and isinstance(around.get("loops"), list):
            return [loop for loop in around["loops"] if isinstance(loop, dict)]
    return []


_FOR_OVER_A_NAME = re.compile(r"^\s*(?:async\s+)?for\s+.+?\s+in\s+([A-Za-z_][A-Za-z_0-9]*)\s*:")


def iterator_not_ended(rank: int, loops: list, states: dict, file) -> dict | None:
    """{"rule": "not_ended", "basis": "observed", ...} when `rank` still holds, not run out, the iterator one of
    `loops` runs over (`for x, y in batches:`, `batches` a local of a frame in `file`; None: any file): it left
    that loop by an exit of its own, not because its data ended. Observed in the run (capture/iterators.py); None
    when it cannot be seen (`for x in stream(shard):` iterates a call whose generator is gone once the loop is left).
    """
    names = {m.group(1) for loop in loops for m in [_FOR_OVER_A_NAME.match(str(loop.get("text") or ""))] if m}
    held = [
        it
        for it in (states.get(rank) or {}).get("iterators") or ()
        if isinstance(it, dict) and it.get("name") in names and file in (None, it.get("file"))
    ]
    if not held or any(it.get("ended") is not False for it in held):
        return None
    return {"rule": "not_ended", "basis": "observed", "name": held[0]["name"], "iterator": held[0].get("kind")}
