"""The rank whose control flow departed from the others': by a decision of its own, or by an exception it caught."""

# local_decision: it left a loop (break, return) or skipped part of an iteration (continue) under a condition on a
# value of its own; caught_exception: an except handler took it off the path the others went on along.

from __future__ import annotations

from .history import FAMILIAR, NEW, epochs_say_left_early, path, turn, went_on_to
from .passes import _side_by_side, _side_records, finding
from .reading import condition_kind, ranks_of, user_location

LOCAL_DECISION = "local_decision"
CAUGHT_EXCEPTION = "caught_exception"
WITHIN = "within"  # between the last common call and the next one: mid-iteration, where no iterator can end
BOUNDARY = "boundary"  # where an iteration ends: the loop's iterator may have ended there as well


def departed(parts: list, states: dict) -> dict | None:
    """Ranks whose last move is new to them, while the others made theirs in earlier iterations: where the departed
    ones left the common path (a `break`, `return`, `continue` or `except` read from the source), and why it was not
    data running out. None when the history, the source or a rank condition does not say so (passes.py decides)."""
    ranks = ranks_of(parts)
    if len(parts) < 2 or any(condition_kind(states.get(r)) for r in ranks):
        return None  # a rank condition explains it: the rules of passes.py
    current = {r: p.record for p in parts for r in p.ranks}
    partition = {r: index for index, p in enumerate(parts) for r in p.ranks}
    paths = {r: path(states[r], current[r]) for r in ranks}
    gone = [r for r in ranks if turn(paths[r]) == NEW]
    stay = [r for r in ranks if turn(paths[r]) == FAMILIAR]
    if not gone or not stay or len(gone) + len(stay) != len(ranks) or len({partition[r] for r in stay}) != 1:
        return None
    common = current[stay[0]]
    if not all(went_on_to(paths[r], common) for r in gone):
        return None  # the others do now what the departed ranks used to do next: else, not one common path
    code = _code(states)
    ways = [_way(r, paths[r], common, stay, states, code) for r in gone]
    if ways[0] is None or any(w is None or _same(w) != _same(ways[0]) for w in ways):
        return None
    return _finding(ways[0], gone, stay, paths[gone[0]], common, parts)


def _same(way: dict) -> tuple:
    return (way["kind"], way["location"]["line"])


def _code(states: dict) -> dict:
    """Every rank's reading of the source ("file:line" -> what encloses it): the ranks run the same code. An entry a
    file holds in another shape (the format checks types, not every key) is left out."""
    code: dict = {}
    for state in states.values():
        found = state.get("code")
        if isinstance(found, dict):
            code.update((key, around) for key, around in found.items() if _usable(around))
    return code


def _usable(around) -> bool:
    """Every key the pass reads is there, with its numbers as numbers."""
    try:
        first, last = around["function"]
        numbers = [first, last]
        for loop in around["loops"]:
            numbers += [loop["line"], loop["end"]] + [e["line"] for e in loop["exits"] if e["kind"]]
            numbers += [e["handler"]["line"] for e in loop["exits"] if e.get("handler")]
        for block in around["tries"]:
            numbers += [block["line"], block["body_end"]] + [h["line"] for h in block["handlers"] if h["then"]]
        return all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)
    except (KeyError, TypeError, ValueError):
        return False


def _key(site: dict) -> str:
    return f"{site.get('file')}:{site.get('line')}"


def _frames(state: dict) -> list:
    """The user's frames of the main thread, outermost first."""
    for stack in state.get("stacks") or ():
        if stack.get("main"):
            return [f for f in stack.get("frames") or () if not f.get("internal") and not f.get("library")]
    return []


# ---------------------------------------------------------------- where the departed rank left the common path

def _way(rank: int, records: list, common: dict, stay: list, states: dict, code: dict) -> dict | None:
    """How `rank` left: tried at its last common call's line, then at the lines that called that function."""
    last, now = records[-2], records[-1]
    mine = _frames(states[rank]) or [user_location(now)]
    theirs = _frames(states[stay[0]]) or [user_location(common)]
    for anchor in _anchors(user_location(last), [mine, theirs], code):
        around = code.get(_key(anchor))
        if not isinstance(around, dict) or not (around.get("loops") or around.get("tries")) or not _numbered(anchor):
            continue
        z = _in_function(around, anchor, user_location(common), theirs)
        z = z if _numbered(z) else None
        way = _through(anchor, around, z, mine, rank, stay, states)
        if way is not None:
            return way
    return None


def _numbered(site: dict | None) -> bool:
    return isinstance((site or {}).get("line"), int)


def _anchors(x: dict | None, stacks: list, code: dict) -> list:
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
        for caller in reversed(frames[:inside[-1]] if inside else []):
            if all(_key(caller) != _key(seen) for seen in found):
                found.append(caller)
    return found


def _spans(around: dict, anchor: dict, site: dict | None) -> bool:
    """Whether `site` is a line of the function `around` describes (same file, within its lines)."""
    first, last = around["function"]
    return bool(site) and site.get("file") == anchor.get("file") and first <= (site.get("line") or 0) <= last


def _in_function(around: dict, anchor: dict, z: dict | None, theirs: list) -> dict | None:
    """Where the others are now, as a line of the anchor's function: their call, or the frame that leads to it."""
    if _spans(around, anchor, z):
        return z
    inside = [f for f in theirs if _spans(around, anchor, f)]
    return inside[-1] if inside else None


def _through(anchor: dict, around: dict, z: dict | None, mine: list, rank: int, stay: list, states: dict):
    """The exit `rank` took out of the anchor's loops (or the handler it went through), when only one fits."""
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
    proof = None
    if boundary:
        proof = ({"rule": "endless"} if any(loop.get("endless") for loop in left)
                 else epochs_say_left_early(rank, stay, states))
    return _chosen(boundary[0], anchor, left, proof) if proof else None


def _exits(around: dict, left: list, still_in_function: bool) -> list:
    """Out of the outermost loop left: a break aimed at it, or a return in it (when the function was left too); a
    rank still in its loop: a continue of the innermost one."""
    loops = around.get("loops") or []
    if left:
        outer = left[-1]
        return [dict(e, loop=outer if e["kind"] == "break" else left[0]) for e in outer["exits"]
                if e["kind"] == "break" or (e["kind"] == "return" and not still_in_function)]
    if loops:
        return [dict(e, loop=loops[0]) for e in loops[0]["exits"] if e["kind"] == "continue"]
    return []


def _handlers(around: dict, anchor: dict, z: dict | None, left: list, lines: list) -> list:
    """Handlers that swallow (`pass`, or nothing that leaves) of a try around the last common call, which skip where
    the others are: their call in the try's body after it, or the whole loop the rank left from inside the try."""
    found = []
    for block in around.get("tries") or ():
        z_in_body = bool(z) and anchor["line"] < (z.get("line") or 0) <= block["body_end"]
        loop_in_body = bool(left) and block["line"] < left[-1]["line"] and left[-1]["end"] <= block["body_end"]
        out_of_it = not any(block["line"] <= line <= block["body_end"] for line in lines)
        if not (z_in_body or (loop_in_body and out_of_it)):
            continue
        for handler in block["handlers"]:
            if handler["then"] in ("pass", "falls"):
                found.append({"line": handler["line"], "kind": handler["then"], "condition": None,
                              "handler": {"line": handler["line"], "text": handler.get("text")}, "loop": None})
    return found


def _local(candidate: dict) -> bool:
    """Taken on some ranks only by a value of their own: under a condition that is not a rank condition, or in an
    except handler. Rank conditions are passes.py's; an unconditional exit would be taken in every iteration."""
    condition = candidate.get("condition")
    return bool(candidate.get("handler")) or bool(condition and not condition.get("rank"))


def _place(candidate: dict, anchor: dict, z: dict | None, around: dict) -> str | None:
    """WITHIN: between the last common call and the others' call, where no iterator ends; BOUNDARY: where an
    iteration ends (or the order is unknown); None: nowhere the rank can have left."""
    x = anchor["line"]
    handler = candidate.get("handler")
    caught_here = handler and any(h["line"] == handler["line"] for b in around.get("tries") or () for h in b["handlers"])
    line = x if caught_here else candidate["line"]  # an exception is raised in the try's body, after that call
    if not z:
        return BOUNDARY
    if x < z["line"]:
        return WITHIN if x <= line <= z["line"] else None
    return BOUNDARY if line >= x or line <= z["line"] else None


def _chosen(candidate: dict, anchor: dict, left: list, proof: dict) -> dict:
    handler = candidate.get("handler")
    kind = CAUGHT_EXCEPTION if handler else LOCAL_DECISION
    line = handler["line"] if handler else candidate["line"]
    loop = candidate.get("loop")
    return {"kind": kind, "location": {"file": anchor["file"], "line": line, "function": anchor.get("function")},
            "exit": {"line": candidate["line"], "kind": candidate["kind"]}, "condition": candidate.get("condition"),
            "handler": handler, "loop": {"line": loop["line"], "text": loop.get("text")} if loop else None,
            "left": bool(left), "proof": proof}


def _finding(way: dict, gone: list, stay: list, records: list, common: dict, parts: list) -> dict:
    departure = {key: way[key] for key in ("exit", "condition", "handler", "loop", "left", "proof")}
    return finding(way["kind"], gone, way["location"],
                   {"mismatched": _side_by_side(parts), "culprit_rule": "departed", "departure": departure},
                   culprits=gone, others=stay, record=records[-1], last=records[-2], waited=common,
                   location=way["location"], side=_side_records(parts), **departure)
