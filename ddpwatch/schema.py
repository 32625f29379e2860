"""Checks a report.json or rank-<r>.json read from disk against format version 1, within limits; no torch.

Reports are files people send each other: a crafted one must end in one FormatError line, never in a traceback,
a MemoryError or minutes of work. So every field the analysis and the renderers read is checked for its type and
range, lists and strings have a size limit, fields ddpwatch does not interpret may not nest deeply, and fields
this version does not know are kept as they are (readers ignore them; see docs/report-format.md).
"""

from __future__ import annotations

import functools
import json
import math

from . import snapshot as S

# Limits, far above what ddpwatch writes (1024 ranks with full stacks: about 30 MB), far below what hurts.
MAX_DOCUMENT_BYTES = 256 * 2**20   # one report.json or rank file
MAX_WORLD_SIZE = 2**20             # ranks in a job
MAX_RECORDS = 20_000               # in-flight plus recent records of one rank (ddpwatch keeps 32 + ring_size)
MAX_THREADS = 4096                 # stacks of one rank
MAX_FRAMES = 10_000                # frames of one stack
MAX_FINDINGS = 10_000
MAX_LIST = 100_000                 # any other list ddpwatch reads (shapes, rows, groups, bars ...)
MAX_STRING = 256 * 2**10           # characters of one string
MAX_DEPTH = 32                     # nesting of fields ddpwatch does not interpret
MAX_TIME = 1e11                    # epoch seconds (year 5138): later ones break the C library's date functions
MAX_NUMBER = 1e15                  # any other number
MAX_INT = 2**63


def _fail(where: str, problem: str):
    raise S.FormatError(f"{where}: {problem}" if where else problem)


def _child(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


# ---------------------------------------------------------------- leaves

def integer(value, where: str, low: int = -MAX_INT, high: int = MAX_INT) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(where, f"expected an integer, got {_type_name(value)}")
    if not low <= value <= high:
        _fail(where, f"{value} is outside {low}..{high}")


def number(value, where: str, low: float = -MAX_NUMBER, high: float = MAX_NUMBER) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        _fail(where, f"expected a number, got {_type_name(value)}")
    if not math.isfinite(value) or not low <= value <= high:
        _fail(where, f"{value!r} is outside {low:g}..{high:g}")


def timestamp(value, where: str) -> None:
    number(value, where, 0.0, MAX_TIME)


def text(value, where: str) -> None:
    if not isinstance(value, str):
        _fail(where, f"expected a string, got {_type_name(value)}")
    if len(value) > MAX_STRING:
        _fail(where, f"a string of {len(value)} characters (at most {MAX_STRING})")


def boolean(value, where: str) -> None:
    if not isinstance(value, bool):
        _fail(where, f"expected true or false, got {_type_name(value)}")


def name(value, where: str) -> None:
    """A process-group id in a Flight Recorder dump: a string or an integer."""
    if isinstance(value, int) and not isinstance(value, bool):
        integer(value, where)
    else:
        text(value, where)


def free(value, where: str) -> None:
    """A field ddpwatch keeps but does not interpret: any JSON, not nested deeply, strings within the limit."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            _fail(where, f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, str):
            text(item, where)
        elif isinstance(item, float) and not math.isfinite(item):
            _fail(where, f"{item!r} is not a number")
        elif isinstance(item, dict):
            pending.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            pending.extend((v, depth + 1) for v in item)


# ---------------------------------------------------------------- combinators

def list_of(check, limit: int = MAX_LIST):
    def checked(value, where: str) -> None:
        if not isinstance(value, (list, tuple)):  # tuples: Flight Recorder pickles hold some
            _fail(where, f"expected a list, got {_type_name(value)}")
        if len(value) > limit:
            _fail(where, f"{len(value)} items (at most {limit})")
        for index, item in enumerate(value):
            check(item, f"{where}[{index}]")
    return checked


def dict_of(check, limit: int = MAX_LIST):
    def checked(value, where: str) -> None:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, got {_type_name(value)}")
        if len(value) > limit:
            _fail(where, f"{len(value)} keys (at most {limit})")
        for key, item in value.items():
            text(key, f"{where} key")
            check(item, f"{where}[{json.dumps(key[:40])}]")
    return checked


def nullable(check):
    def checked(value, where: str) -> None:
        if value is not None:
            check(value, where)
    return checked


def fields(spec: dict, required: tuple = ()):
    """An object whose known fields pass their checks (those in `required` must be there); other fields: free."""
    def checked(value, where: str) -> None:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, got {_type_name(value)}")
        for key in required:
            if key not in value:
                _fail(where, f"no {key!r}")
        for key, item in value.items():
            check = spec.get(key)
            if check is not None:
                check(item, _child(where, key))
            else:
                free(item, _child(where, str(key)[:40]))
    return checked


def ranged(low: int, high: int):
    return lambda value, where: integer(value, where, low, high)


# ---------------------------------------------------------------- ddpwatch's objects

site = fields({"file": text, "line": nullable(integer), "function": text}, required=("file", "line", "function"))
region = fields({"kind": text, "site": nullable(site), "api": nullable(text)}, required=("kind",))
shapes = list_of(list_of(integer, 64), 1024)

record = fields({
    "seq": integer, "group": text, "op": text, "api": nullable(text), "p2p": boolean,
    "peer": nullable(integer), "shapes": shapes, "dtypes": list_of(text, 1024), "site": nullable(site),
    "region": nullable(region), "start": nullable(timestamp), "age_s": number,
    "duration_s": nullable(number), "state": text, "error": nullable(text), "thread": nullable(text),
}, required=("seq", "group", "op", "state"))

frame = fields({"file": text, "line": nullable(integer), "function": text, "internal": boolean},
               required=("file", "line", "function"))
stack = fields({"thread": nullable(text), "main": boolean, "frames": list_of(frame, MAX_FRAMES)},
               required=("frames",))
process = fields({"status": nullable(text), "cpu_percent": nullable(number), "rss_mb": nullable(number),
                  "threads": nullable(integer), "exists": nullable(boolean), "error": nullable(text)})
progress_bar = fields({"desc": nullable(text), "n": nullable(integer), "total": nullable(integer),
                       "since_update_s": nullable(number)})
source = fields({"kind": text, "files": list_of(text, MAX_WORLD_SIZE)})


@functools.lru_cache(maxsize=8)
def _rank_fields(world_size: int):
    rank = ranged(0, world_size - 1)
    return fields({
        "format_version": integer, "rank": rank, "world_size": ranged(1, MAX_WORLD_SIZE),
        "pid": nullable(integer), "host": nullable(text), "beat": nullable(number),
        "published_at": nullable(timestamp), "status": text, "progress": nullable(number),
        "ops_recorded": nullable(number), "idle_s": number,
        "inflight": list_of(record, MAX_RECORDS), "recent": list_of(record, MAX_RECORDS),
        "last_seq": dict_of(nullable(integer)), "groups": dict_of(nullable(list_of(rank, MAX_WORLD_SIZE))),
        "stacks": list_of(stack, MAX_THREADS), "ddp_steps": nullable(integer), "site_counts": dict_of(integer),
        "process": nullable(process), "progress_bars": list_of(progress_bar, 1024), "stale": nullable(boolean),
        "store_lost": nullable(boolean),
    }, required=("rank", "world_size"))


def _world_size(doc, where: str, required: tuple) -> int:
    """The document's world size, checked first: every rank in it is checked against it."""
    if not isinstance(doc, dict):
        _fail(where, f"expected an object, got {_type_name(doc)}")
    for key in required:
        if key not in doc:
            _fail(where, f"no {key!r}")
    integer(doc["world_size"], _child(where, "world_size"), 1, MAX_WORLD_SIZE)
    return doc["world_size"]


def checked(check, doc, path: str) -> None:
    """Run a check on a document read from `path`; its FormatError starts with the path, then the field."""
    try:
        check(doc, "")
    except S.FormatError as exc:
        raise S.FormatError(f"{path}: {exc}") from None


def rank_snapshot(doc: dict, where: str, world_size: int | None = None) -> None:
    """A rank snapshot (a rank-<r>.json, or one of an incident's `ranks`): ranks below the incident's world size,
    or below the snapshot's own."""
    _world_size(doc, where, ("rank", "world_size"))
    _rank_fields(world_size or doc["world_size"])(doc, where)
    if len(doc.get("inflight") or ()) + len(doc.get("recent") or ()) > MAX_RECORDS:
        _fail(where, f"more than {MAX_RECORDS} records")


def _finding(world_size: int):
    rank = ranged(0, world_size - 1)
    row = fields({"ranks": list_of(rank, MAX_WORLD_SIZE), "group": text, "seq": nullable(integer),
                  "op": nullable(text), "api": nullable(text), "shapes": shapes, "dtypes": list_of(text, 1024),
                  "site": nullable(site), "region": nullable(region), "wait_s": nullable(number),
                  "description": nullable(text)}, required=("ranks", "group", "seq", "op"))
    evidence = fields({"mismatched": list_of(row)})
    return fields({"kind": text, "ranks": list_of(rank, MAX_WORLD_SIZE), "summary": text, "fix": text,
                   "location": nullable(site), "evidence": nullable(evidence)},
                  required=("kind", "ranks", "summary", "fix"))


def incident(doc: dict, where: str) -> None:
    """A whole incident (report.json)."""
    world_size = _world_size(doc, where, ("world_size", "ranks", "findings"))
    state = functools.partial(rank_snapshot, world_size=world_size)
    fields({
        "format_version": integer, "run_id": nullable(text), "created_at": nullable(timestamp),
        "trigger": nullable(text), "written_by": nullable(ranged(0, world_size - 1)),
        "grace": lambda v, w: number(v, w, 0.0), "timeout": lambda v, w: number(v, w, 0.0),
        "report_dir": nullable(text), "missing_ranks": list_of(ranged(0, world_size - 1), MAX_WORLD_SIZE),
        "ranks": list_of(state, world_size),
        "findings": list_of(_finding(world_size), MAX_FINDINGS), "source": nullable(source),
        "world_size": integer,
    })(doc, where)
    seen = [state["rank"] for state in doc["ranks"]]
    if len(set(seen)) != len(seen):
        _fail(_child(where, "ranks"), "a rank appears twice")


def read_limited(path: str, limit: int) -> bytes:
    """A file's bytes, refused (FormatError) past `limit` before anything is parsed."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise S.FormatError(f"{path}: larger than {limit // 2**20} MiB, the most ddpwatch reads")
    return data


def loads(data: bytes, where: str):
    """JSON from bytes: NaN and Infinity refused (they are not JSON), deep nesting an error, not a crash."""
    def no_constants(token):
        raise S.FormatError(f"{where}: {token} is not a JSON number")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=no_constants)
    except RecursionError:
        raise S.FormatError(f"{where}: nested too deeply") from None
    except MemoryError:
        raise S.FormatError(f"{where}: too large to load into memory") from None
