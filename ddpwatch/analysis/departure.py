"""The rank whose control flow departed from the others': by a decision of its own, or by an exception it caught."""

# local_decision: it left a loop (break, return) or skipped part of an iteration (continue) under a condition on a
# value of its own; caught_exception: an except handler took it off the path the others went on along.

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from ..format import build
from .history import FAMILIAR, NEW, epochs_say_left_early, iterator_not_ended, path, position, turn, went_on_to
from .passes import _side_by_side, _side_records, ddp_forward_on_subset, finding, shape_mismatch
from .reading import at_lowest, blocked_records, code_of, condition_kind, members, partitions, ranks_of, user_location

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import RecordDoc

    Line = Mapping[str, Any]  # a site or a frame (a Site, or a dict read from facts): its "file" and "line"

LOCAL_DECISION = "local_decision"
CAUGHT_EXCEPTION = "caught_exception"
WITHIN = "within"  # between the last common call and the next one: mid-iteration, where no iterator can end
BOUNDARY = "boundary"  # where an iteration ends: the loop's iterator may have ended there as well
COUNTED = "counted"  # every loop it left runs as many iterations on every rank (static.exits: `range(10)`)
EQUAL_LENGTHS = "equal_lengths"  # its DataLoader has as many batches on every rank, and they are in the same epoch
SAME_ITERATIONS = (COUNTED, EQUAL_LENGTHS)  # proofs that every rank runs the loops it left as many times
IN_HANDLER = "in_handler"  # it stands in an except handler of a try whose body holds the others
PASSED_BY = "passed_by"  # the others stand in a call that it went past on its way round the loop


def departed(parts: list, states: dict) -> dict | None:
    """Ranks whose last move is new to them, while the others made theirs in earlier iterations: where the departed
    ones left the common path (a `break`, `return`, `continue` or `except` read from the source), and why it was not
    data running out. Or ranks standing in an except handler whose try holds the others. None when the history, the
    source or a rank condition does not say so (passes.py decides)."""
    ranks = ranks_of(parts)
    if len(parts) < 2 or any(condition_kind(states.get(r)) for r in ranks):
        return None  # a rank condition explains it: the rules of passes.py
    code = code_of(states)
    found = _in_handler(parts, states, code)
    if found is not None:
        return found
    current = {r: p.record for p in parts for r in p.ranks}
    partition = {r: index for index, p in enumerate(parts) for r in p.ranks}
    paths = {r: path(states[r], current[r]) for r in ranks}
    gone = [r for r in ranks if turn(paths[r]) == NEW]
    stay = [r for r in ranks if turn(paths[r]) == FAMILIAR]
    if gone and stay and len(gone) + len(stay) == len(ranks) and len({partition[r] for r in stay}) == 1:
        common = current[stay[0]]
        if not all(went_on_to(paths[r], common) for r in gone):
            return None  # the others do now what the departed ranks used to do next: else, not one common path
        ways = [_way(r, paths[r], common, stay, states, code) for r in gone]
        if ways[0] is not None and all(w is not None and _same(w) == _same(ways[0]) for w in ways):
            return _finding(ways[0], gone, stay, paths[gone[0]], common, parts)
        if any(w is not None for w in ways):
            return None
    if len(parts) != 2:
        return None
    # No exit of their own: maybe the others went past the call these ranks stand in (no history of it needed)
    first, second = parts
    return _passed_by(first.ranks, second.ranks, paths, states, code, parts) or _passed_by(
        second.ranks, first.ranks, paths, states, code, parts
    )


def departed_and_exited(live: dict, exited: dict, grace: float, world_size: int) -> dict | None:
    """Ranks that exited while the others wait in a move they made before, from the call the exited ranks finished
    last: an exit they took out of the loop (or a skipped iteration) read from the source, as for a rank that waits
    elsewhere (the live ranks' states hold the source read around those lines). `exited`: {rank: its last state}.
    None: the exited-rank rule decides."""
    waiting = blocked_records(live, grace)
    if not isinstance(exited, dict) or not waiting or len(partitions(waiting)) != 1:
        return None
    common = next(iter(waiting.values()))
    group_members = set(members(live, common["group"], world_size))  # asked in the test: once per exited rank
    gone = sorted(r for r in exited if r in group_members)
    stay = sorted(waiting)
    if not gone or any(condition_kind(live.get(r)) for r in stay):
        return None
    paths = {r: path(live[r], waiting[r]) for r in stay}
    if not all(turn(paths[r]) == FAMILIAR for r in stay):
        return None
    last = paths[stay[0]][-2]
    states = {**live, **{r: exited[r] for r in gone}}
    code = code_of(live)
    ways = []
    for rank in gone:
        records = _finished(exited[rank], common) + [common]
        if len(records) < 3 or position(records[-2]) != position(last) or not went_on_to(records, common):
            return None
        ways.append(_way(rank, records, common, stay, states, code))
    if ways[0] is None or any(w is None or _same(w) != _same(ways[0]) for w in ways):
        return None
    return _finding(ways[0], gone, stay, [last, None], common, partitions(waiting))


def _finished(state: dict, common: RecordDoc) -> list:
    """An exited rank's finished calls on the others' thread, oldest first."""
    return [
        r
        for r in (state or {}).get("recent") or ()
        if isinstance(r, dict)
        and not r.get("p2p")
        and r.get("state") == build.COMPLETED
        and r.get("thread") == common.get("thread")
    ]


def _same(way: dict) -> tuple:
    return (way["kind"], way["location"]["line"])


def _key(site: Line) -> str:
    return f"{site.get('file')}:{site.get('line')}"


def _frames(state: dict | None) -> list:
    """The user's frames of the main thread, outermost first."""
    for stack in (state or {}).get("stacks") or ():
        if stack.get("main"):
            return [f for f in stack.get("frames") or () if not f.get("internal") and not f.get("library")]
    return []


# ---------------------------------------------------------------- where the departed rank left the common path


def _way(rank: int, records: list, common: RecordDoc, stay: list, states: dict, code: dict) -> dict | None:
    """How `rank` left: tried at its last common call's line, then at the lines that called that function."""
    last, now = records[-2], records[-1]
    exited = states[rank] is None or states[rank].get("status") == build.EXITED
    mine = [] if exited else (_frames(states[rank]) or [user_location(now)])
    theirs = _frames(states[stay[0]]) or [user_location(common)]
    for anchor in _anchors(user_location(last), [mine, theirs], code):
        around = code.get(_key(anchor))
        if not isinstance(around, dict) or not (around.get("loops") or around.get("tries")) or not _numbered(anchor):
            continue
        z = _in_function(around, anchor, user_location(common), theirs)
        z = z if _numbered(z) else None
        sites = map(user_location, records[:-1] + [common])
        calls = [site["line"] for site in sites if site and _spans(around, anchor, site)]  # no site: no span
        way = _through(anchor, around, z, mine, rank, stay, states, calls)
        if way is not None:
            return way
    return None


def _numbered(site: Line | None) -> bool:
    return isinstance((site or {}).get("line"), int)


def _anchors(x: Line | None, stacks: list, code: dict) -> list:
    """The last common call's line, then the lines that called its function (from the ranks' stacks), innermost
    first: a helper raised or returned, and the loop it left is its caller's."""
    if not x:
        return []
    found = [x]
    around = code.get(_key(x))
    if not isinstance(around, dict):
        return found
    for frames in stacks:
        inside = [i for i, f in enumerate(frames) if _spans(around, x, f)]
        for caller in reversed(frames[: inside[-1]] if inside else []):
            if all(_key(caller) != _key(seen) for seen in found):
                found.append(caller)
    return found


def _spans(around: dict, anchor: Line, site: Line | None) -> bool:
    """Whether `site` is a line of the function `around` describes (same file, within its lines)."""
    first, last = around["function"]
    if not site:
        return False
    return site.get("file") == anchor.get("file") and first <= (site.get("line") or 0) <= last


def _in_function(around: dict, anchor: Line, z: Line | None, theirs: list) -> Line | None:
    """Where the others are now, as a line of the anchor's function: their call, or the frame that leads to it."""
    if _spans(around, anchor, z):
        return z
    inside = [f for f in theirs if _spans(around, anchor, f)]
    return inside[-1] if inside else None


def _through(anchor: Line, around: dict, z: Line | None, mine: list, rank: int, stay: list, states: dict, calls: list):
    """The exit `rank` took out of the anchor's loops (or the handler it went through), when only one fits. `calls`:
    the lines of this function its collectives came from."""
    lines = [f.get("line") or 0 for f in mine if f and f.get("file") == anchor.get("file")]
    left = []
    for loop in around.get("loops") or ():
        if any(loop["line"] <= line <= loop["end"] for line in lines):
            break
        left.append(loop)
    still_in_function = any(_spans(around, anchor, f) for f in mine)
    candidates = _exits(around, left, still_in_function) + _handlers(around, anchor, z, left, lines)
    placed = [(c, _place(c, anchor, z, around)) for c in candidates if _local(c)]
    within = [c for c, where in placed if where == WITHIN]
    if within:
        return _chosen(within[0], anchor, left, {"rule": WITHIN})
    boundary = [c for c, where in placed if where == BOUNDARY]
    proof = _cannot_run_out(left, rank, stay, states) if left else None
    if not proof:
        return None
    skips = _distinct([c for c in _skips(around, left, calls) if _local(c)])
    if boundary:
        # A rank that skipped iterations (a continue) also ends loops of as many iterations before the others.
        ambiguous = proof["rule"] in SAME_ITERATIONS and skips
        return None if ambiguous else _chosen(boundary[0], anchor, left, proof)
    if proof["rule"] in SAME_ITERATIONS and len(skips) == 1:
        # It left loops that run as many iterations on every rank, by no exit: it ran them all, with fewer
        # collectives than the others, so it skipped those of some iteration, by the one way the loops offer.
        return _chosen(skips[0], anchor, left, dict(proof, skipped=True))
    return None


def _cannot_run_out(left: list, rank: int, stay: list, states: dict) -> dict | None:
    """Why the loops `rank` left did not end by its data running out first, or None: what it holds (observed), the
    loops' headers (read), its DataLoader epochs (observed)."""
    held = iterator_not_ended(rank, left, states, None)
    if held:
        return held
    if any(loop.get("endless") for loop in left):
        return {"rule": "endless"}
    if all(loop.get("counted") is True for loop in left):
        return {"rule": COUNTED, "loops": [loop.get("text") for loop in left]}
    return epochs_say_left_early(rank, stay, states)


def _exits(around: dict, left: list, still_in_function: bool) -> list:
    """Out of the outermost loop left: a break aimed at it, or a return in it (when the function was left too); a
    rank still in its loop: a continue of the innermost one."""
    loops = around.get("loops") or []
    if left:
        outer = left[-1]
        return [
            dict(e, loop=outer if e["kind"] == "break" else left[0])
            for e in outer["exits"]
            if e["kind"] == "break" or (e["kind"] == "return" and not still_in_function)
        ]
    if loops:
        return [dict(e, loop=loops[0]) for e in loops[0]["exits"] if e["kind"] == "continue"]
    return []


def _skips(around: dict, left: list, calls: list) -> list:
    """The ways to skip collectives of an iteration of the loops left, without leaving the outermost: a continue
    aimed at one of them, or a break out of an inner one, placed before a line of that loop the rank's collectives
    came from (`calls`); an except handler that swallows what the try around the last common call raised."""
    found = []
    for index, loop in enumerate(left):
        kinds = ("continue", "break") if index < len(left) - 1 else ("continue",)
        found += [
            dict(e, loop=loop)
            for e in loop["exits"]
            if e["kind"] in kinds and any(e["line"] < line <= loop["end"] for line in calls)
        ]
    outer = left[-1]
    for block in around.get("tries") or ():
        if outer["line"] < block["line"] <= outer["end"]:
            found += [
                {
                    "line": h["line"],
                    "kind": h["then"],
                    "condition": None,
                    "loop": outer,
                    "handler": {"line": h["line"], "text": h.get("text")},
                }
                for h in block["handlers"]
                if h["then"] in ("pass", "falls")
            ]
    return found


def _distinct(candidates: list) -> list:
    seen: dict = {}
    for c in candidates:
        seen.setdefault(((c.get("handler") or {}).get("line"), c["line"], c["kind"]), c)
    return list(seen.values())


def _handlers(around: dict, anchor: Line, z: Line | None, left: list, lines: list) -> list:
    """Handlers that swallow (`pass`, or nothing that leaves) of a try around the last common call, which skip where
    the others are: their call in the try's body after it, or the whole loop the rank left from inside the try."""
    found = []
    z_line = z.get("line") if z else None
    for block in around.get("tries") or ():
        z_in_body = bool(z) and anchor["line"] < (z_line or 0) <= block["body_end"]
        loop_in_body = bool(left) and block["line"] < left[-1]["line"] and left[-1]["end"] <= block["body_end"]
        out_of_it = not any(block["line"] <= line <= block["body_end"] for line in lines)
        if not (z_in_body or (loop_in_body and out_of_it)):
            continue
        for handler in block["handlers"]:
            if handler["then"] in ("pass", "falls"):
                found.append(
                    {
                        "line": handler["line"],
                        "kind": handler["then"],
                        "condition": None,
                        "handler": {"line": handler["line"], "text": handler.get("text")},
                        "loop": None,
                    }
                )
    return found


def _local(candidate: dict) -> bool:
    """Taken on some ranks only by a value of their own: under a condition that is not a rank condition, or in an
    except handler. Rank conditions are passes.py's; an unconditional exit would be taken in every iteration. An
    exit on what a helper returned is decided by the helper's own condition."""
    decided = candidate.get("decided_in")
    condition = (
        decided["condition"] if isinstance(decided, dict) and decided.get("condition") else candidate.get("condition")
    )
    if (candidate.get("handler") or {}).get("exhausted"):
        return False  # `except StopIteration: break`: its data ran out, as a `for` loop's does; no decision, no error
    return bool(candidate.get("handler")) or bool(condition and not condition.get("rank"))


def _place(candidate: dict, anchor: Line, z: Line | None, around: dict) -> str | None:
    """WITHIN: between the last common call and the others' call, where no iterator ends; BOUNDARY: where an
    iteration ends (or the order is unknown); None: nowhere the rank can have left."""
    x = anchor["line"]
    handler = candidate.get("handler")
    caught_here = handler and any(
        h["line"] == handler["line"] for b in around.get("tries") or () for h in b["handlers"]
    )
    line = x if caught_here else candidate["line"]  # an exception is raised in the try's body, after that call
    if not z:
        return BOUNDARY
    if x < z["line"]:
        return WITHIN if x <= line <= z["line"] else None
    return BOUNDARY if line >= x or line <= z["line"] else None


def _chosen(candidate: dict, anchor: Line, left: list, proof: dict) -> dict:
    handler = candidate.get("handler")
    kind = CAUGHT_EXCEPTION if handler else LOCAL_DECISION
    line = handler["line"] if handler else candidate["line"]
    loop = candidate.get("loop")
    location = {"file": anchor["file"], "line": line, "function": anchor.get("function")}
    condition = candidate.get("condition")
    decided = candidate.get("decided_in")
    helper = None
    if not handler and isinstance(decided, dict) and decided.get("condition") and isinstance(decided.get("line"), int):
        # `x = helper()`, `if x is None: continue`: the helper's condition decided; its return is the line to change
        helper = {"line": decided["line"], "function": decided.get("function"), "text": decided.get("text")}
        location = {"file": anchor["file"], "line": decided["line"], "function": decided.get("function")}
        condition, helper["caller_condition"] = decided["condition"], candidate.get("condition")
    return {
        "kind": kind,
        "location": location,
        "exit": {"line": candidate["line"], "kind": candidate["kind"]},
        "condition": condition,
        "handler": handler,
        "loop": {"line": loop["line"], "text": loop.get("text")} if loop else None,
        "left": bool(left),
        "proof": proof,
        "helper": helper,
    }


def _finding(way: dict, gone: list, stay: list, records: list, common: RecordDoc, parts: list) -> dict:
    departure = {key: way[key] for key in ("exit", "condition", "handler", "loop", "left", "proof", "helper")}
    return finding(
        way["kind"],
        gone,
        way["location"],
        {"mismatched": _side_by_side(parts), "culprit_rule": "departed", "departure": departure},
        culprits=gone,
        others=stay,
        record=records[-1],
        last=records[-2],
        waited=common,
        location=way["location"],
        side=_side_records(parts),
        **departure,
    )


# ---------------------------------------------------------------- ranks inside an except handler


def _in_handler(parts: list, states: dict, code: dict) -> dict | None:
    """Ranks whose main thread stands in an `except` handler of a try whose body holds the others' frame in the same
    function: an exception was raised on them only, and their handler talks to the others (it waits in a
    collective) while the others are still in the try. No history needed: the stacks show where each rank is."""
    frames = {r: _frames(states.get(r)) for p in parts for r in p.ranks}
    ranks = sorted(frames)
    if not all(frames.values()):
        return None
    depth = _diverge(frames)
    if depth is None:
        return None
    lines = {r: frames[r][depth] for r in ranks}
    for r in ranks:
        around = code.get(_key(lines[r]))
        for block in (around or {}).get("tries") or ():
            for handler in block["handlers"]:
                inside = [q for q in ranks if handler["line"] <= lines[q]["line"] <= handler.get("end", -1)]
                body = [q for q in ranks if block["line"] <= lines[q]["line"] <= block["body_end"]]
                if inside and body and len(inside) + len(body) == len(ranks):
                    return _handler_finding(inside, body, lines, handler, block, parts)
    return None


def _diverge(frames: dict) -> int | None:
    """The depth at which the ranks' frames first differ, when every rank is in the same function there."""
    stacks = list(frames.values())
    for depth in range(min(len(f) for f in stacks)):
        here = {(f[depth].get("file"), f[depth].get("function")) for f in stacks}
        if len(here) != 1:
            return None
        if len({f[depth].get("line") for f in stacks}) > 1:
            return depth if all(isinstance(f[depth].get("line"), int) for f in stacks) else None
    return None


def _handler_finding(inside: list, body: list, lines: dict, handler: dict, block: dict, parts: list) -> dict:
    record = next(p.record for p in parts if inside[0] in p.ranks)
    waited = next(p.record for p in parts if body[0] in p.ranks)
    frame = lines[inside[0]]
    location = {"file": frame.get("file"), "line": handler["line"], "function": frame.get("function")}
    departure = {
        "exit": {"line": handler["line"], "kind": handler.get("then")},
        "condition": None,
        "handler": {"line": handler["line"], "text": handler.get("text")},
        "loop": None,
        "left": False,
        "proof": {
            "rule": IN_HANDLER,
            "try": block["line"],
            "at": frame.get("line"),
            "others_at": lines[body[0]].get("line"),
        },
        "helper": None,
    }
    return finding(
        CAUGHT_EXCEPTION,
        inside,
        location,
        {"mismatched": _side_by_side(parts), "culprit_rule": "departed", "departure": departure},
        culprits=inside,
        others=body,
        record=record,
        last=None,
        waited=waited,
        location=location,
        side=_side_records(parts),
        **departure,
    )


# ---------------------------------------------------------------- ranks that went past a call the others stand in


def _passed_by(gone: list, stay: list, paths: dict, states: dict, code: dict, parts: list) -> dict | None:
    """The ranks `gone` stand in a call made from a line of the loop around the last call every rank finished, after
    loops that run as many iterations on every rank (and that offer no way out of their own); the others, with the
    same calls behind them, stand elsewhere in that loop, so they left those loops at the same point and went past
    the same line: they left the call early, by a `return` before the line the first ranks wait at (or by a
    `continue` before the line), under a condition of their own. Those are the departed ones."""
    if not _same_history([paths[r][:-1] for r in gone + stay]):
        return None
    x = user_location(paths[gone[0]][-2])
    if not x:
        return None
    around = code.get(_key(x))
    if not isinstance(around, dict) or not _numbered(x):
        return None
    mine = _frames(states[gone[0]])
    at = [i for i, f in enumerate(mine) if _spans(around, x, f)]
    theirs = [f for f in _frames(states[stay[0]]) if _spans(around, x, f)]
    if not at or not theirs:
        return None
    line = mine[at[-1]]["line"]
    left = [loop for loop in around["loops"] if not loop["line"] <= line <= loop["end"]]
    shared = next((loop for loop in around["loops"] if loop["line"] <= line <= loop["end"]), None)
    back = theirs[-1].get("line")
    if shared is None or not left or back == line or not shared["line"] <= (back or 0) <= shared["end"]:
        return None
    if any(_local(e) for loop in left for e in loop["exits"]):
        return None  # it may have left those loops early itself
    proof = _same_iterations(left, gone[0], stay, states)
    if proof is None:
        return None
    after = left[-1]["end"]
    candidates = [dict(e, loop=shared) for e in shared["exits"] if e["kind"] == "continue" and after < e["line"] < line]
    callees = mine[at[-1] + 1 :]
    for frame in callees:
        inner = code.get(_key(frame))
        if isinstance(inner, dict) and _numbered(frame):
            candidates += [
                dict(e, loop=None, file=frame.get("file"), function=frame.get("function"))
                for e in inner.get("returns") or ()
                if isinstance(e.get("line"), int)
                and e["line"] < frame["line"]
                and _spans(inner, frame, {"file": frame.get("file"), "line": e["line"]})
            ]
    chosen = _distinct([c for c in candidates if _local(c)])
    if len(chosen) != 1:
        return None
    exit_ = chosen[0]
    anchor = {
        "file": exit_.get("file") or x.get("file"),
        "line": x["line"],
        "function": exit_.get("function") or x.get("function"),
    }
    way = _chosen(
        exit_,
        anchor,
        [],
        dict(
            proof,
            rule=PASSED_BY,
            by=proof["rule"],
            at=line,
            call=(callees[-1] if callees else mine[at[-1]]).get("line"),
        ),
    )
    way["loop"] = {"line": shared["line"], "text": shared.get("text")}
    records = paths[stay[0]]
    waited = paths[gone[0]][-1]
    departure = {key: way[key] for key in ("exit", "condition", "handler", "loop", "left", "proof", "helper")}
    return finding(
        way["kind"],
        stay,
        way["location"],
        {"mismatched": _side_by_side(parts), "culprit_rule": "departed", "departure": departure},
        culprits=stay,
        others=gone,
        record=records[-1],
        last=records[-2],
        waited=waited,
        location=way["location"],
        side=_side_records(parts),
        **departure,
    )


def _same_history(histories: list) -> bool:
    """Every rank finished the same calls (positions), as far back as all of them remember."""
    depth = min(len(h) for h in histories)
    return depth > 0 and len({tuple(position(r) for r in h[len(h) - depth :]) for h in histories}) == 1


def _same_iterations(left: list, rank: int, others: list, states: dict) -> dict | None:
    """Proof that the others ran the loops `rank` left as many times as it did (and so left them as it did)."""
    if all(loop.get("counted") is True for loop in left):
        return {"rule": COUNTED, "loops": [loop.get("text") for loop in left]}
    proof = epochs_say_left_early(rank, others, states)
    return proof if proof and proof["rule"] in ("began_more", EQUAL_LENGTHS) else None


# ---------------------------------------------------------------- ranks at different positions


def departed_ahead(parts: list, states: dict) -> dict | None:
    """Ranks of one group at different positions (a departed rank went on through a collective that completed
    without the others: an empty tensor, a same-sized call of theirs): departed() on what each did at the lowest
    position anyone waits at, after the rules that come before it there (sizes, a DDP forward on a subset)."""
    if len({rec["seq"] for _, rec in parts}) < 2:
        return None
    regrouped = at_lowest(parts, states)
    if len(regrouped) < 2 or shape_mismatch(regrouped, states) or ddp_forward_on_subset(regrouped, states):
        return None  # sequence_divergence says it
    found = departed(regrouped, states)
    if found is not None:
        found["evidence"]["sequence"] = {"group": parts[0].record["group"], "seq": min(r["seq"] for _, r in parts)}
        now = {r: p.record for p in parts for r in p.ranks}
        found["facts"]["record"] = now[found["facts"]["culprits"][0]]  # where the departed ranks wait now
    return found
