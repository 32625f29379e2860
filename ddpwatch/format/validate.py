"""Checks a report.json or rank-<r>.json read from disk against format version 1, within limits; no torch.

Reports are files people send each other: a crafted one must end in one FormatError line, never in a traceback,
a MemoryError or minutes of work. So every field the analysis and the renderers read is checked for its type and
range, lists and strings have a size limit, fields ddpwatch does not interpret may not nest deeply, and fields
this version does not know are kept as they are (readers ignore them; see docs/report-format.md).

The checks of ddpwatch's own objects are derived from ddpwatch/format/types.py, the one definition of their fields and
types: a field added there is checked here. This module adds only what a type cannot say: bounds (LIMITS), the
keys a reader insists on (REQUIRED), the field checked FIRST, and checks across fields (ACROSS). The combinators
below also check torch's Flight Recorder dumps (sources/flight_recorder_files.py), whose format is not ddpwatch's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from typing import Any, Callable

from .version import FormatError

# Limits, far above what ddpwatch writes (1024 ranks with full stacks: about 30 MB), far below what hurts.
MAX_DOCUMENT_BYTES = 256 * 2**20  # one report.json or rank file
MAX_WORLD_SIZE = 2**20  # ranks in a job
MIN_WORLD_SIZE = 1
MAX_RECORDS = 20_000  # in-flight plus recent records of one rank (ddpwatch keeps 32 + ring_size)
MAX_THREADS = 4096  # stacks of one rank
MAX_FRAMES = 10_000  # frames of one stack
MAX_FINDINGS = 10_000
MAX_LIST = 100_000  # any other list ddpwatch reads (shapes, rows, groups, bars ...)
MAX_STRING = 256 * 2**10  # characters of one string
MAX_DEPTH = 32  # nesting of fields ddpwatch does not interpret
MAX_TIME = 1e11  # epoch seconds (year 5138): later ones break the C library's date functions
MAX_NUMBER = 1e15  # any other number
MAX_INT = 2**63


# Where a field sits, for an error message: a string, or (parent, how, key) built as the checks descend and spelled
# only when a check fails (where_text). A look at a many-rank hang checks every rank's position: with paths spelled
# on the way down and every leaf called, a position's checks took 15 us, 10 us now (`python -m
# benchmarks.look_parts`, docs/scale.md).
Where = typing.Union[str, tuple]
_FIELD, _ITEM, _KEY_OF, _THE_KEY = ".", "[]", "{}", " key"


def where_text(where: Where) -> str:
    """A field's path as error messages spell it: `a.b`, `a[3]`, `a["key"]`, `a key` (a dict's key itself)."""
    if isinstance(where, str):
        return where
    parent, how, key = where
    above = where_text(parent)
    if how == _FIELD:
        key = str(key)[:40]
        return f"{above}.{key}" if above else key
    if how == _ITEM:
        return f"{above}[{key}]"
    if how == _KEY_OF:
        return f"{above}[{json.dumps(key[:40])}]"
    return f"{above}{_THE_KEY}"


def _fail(where: Where, problem: str):
    where = where_text(where)
    raise FormatError(f"{where}: {problem}" if where else problem)


def _child(where: Where, key: str) -> Where:
    return (where, _FIELD, key)


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


# ---------------------------------------------------------------- leaves


def integer(value, where: Where, low: int = -MAX_INT, high: int = MAX_INT) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(where, f"expected an integer, got {_type_name(value)}")
    if not low <= value <= high:
        _fail(where, f"{value} is outside {low}..{high}")


def number(value, where: Where, low: float = -MAX_NUMBER, high: float = MAX_NUMBER) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        _fail(where, f"expected a number, got {_type_name(value)}")
    if not math.isfinite(value) or not low <= value <= high:
        _fail(where, f"{value!r} is outside {low:g}..{high:g}")


def text(value, where: Where) -> None:
    if not isinstance(value, str):
        _fail(where, f"expected a string, got {_type_name(value)}")
    if len(value) > MAX_STRING:
        _fail(where, f"a string of {len(value)} characters (at most {MAX_STRING})")


def boolean(value, where: Where) -> None:
    if not isinstance(value, bool):
        _fail(where, f"expected true or false, got {_type_name(value)}")


def name(value, where: Where) -> None:
    """A process-group id in a Flight Recorder dump: a string or an integer."""
    if isinstance(value, int) and not isinstance(value, bool):
        integer(value, where)
    else:
        text(value, where)


def free(value, where: Where) -> None:
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
    def checked(value, where: Where) -> None:
        if not isinstance(value, (list, tuple)):  # tuples: Flight Recorder pickles hold some
            _fail(where, f"expected a list, got {_type_name(value)}")
        if len(value) > limit:
            _fail(where, f"{len(value)} items (at most {limit})")
        for index, item in enumerate(value):
            check(item, (where, _ITEM, index))

    return checked


def dict_of(check, limit: int = MAX_LIST):
    def checked(value, where: Where) -> None:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, got {_type_name(value)}")
        if len(value) > limit:
            _fail(where, f"{len(value)} keys (at most {limit})")
        for key, item in value.items():
            text(key, (where, _THE_KEY, None))
            check(item, (where, _KEY_OF, key))

    return checked


def nullable(check):
    def checked(value, where: Where) -> None:
        if value is not None:
            check(value, where)

    checked.inner = check  # type: ignore[attr-defined]  # fields() skips a None without the call
    return checked


def _plain_type(check):
    """The type whose plain values pass `check` at a glance (fields() then skips the call): str for text (within
    MAX_STRING), int for integer and float for number (within their default ranges; a NaN compares outside any),
    bool for boolean; None for any other check, which is always called."""
    return {text: str, integer: int, number: float, boolean: bool}.get(check)


# What a plain value of each type may reach (its length for a str, its size for a number), for fields().
_PLAIN_LIMIT = {str: MAX_STRING, int: MAX_INT, float: MAX_NUMBER}


def fields(spec: dict, required: tuple = (), first: tuple = ()):
    """An object whose known fields pass their checks (those in `required` must be there, those in `first` are
    checked before the others); other fields: free.

    The loop runs once per field of every document read (a look at a many-rank hang checks every rank's position),
    so a field that may be null and is, or a plain leaf (_plain_type), is passed without calling its check."""
    inner = {key: getattr(check, "inner", check) for key, check in spec.items()}
    may_be_null = {key for key, check in spec.items() if hasattr(check, "inner")}
    plain = {key: _plain_type(check) for key, check in inner.items()}

    def checked(value, where: Where) -> None:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, got {_type_name(value)}")
        for key in required:
            if key not in value:
                _fail(where, f"no {key!r}")
        for key in first:
            if key in value:
                spec[key](value[key], (where, _FIELD, key))
        for key, item in value.items():
            check = inner.get(key)
            if check is None:
                free(item, (where, _FIELD, key))
                continue
            kind = type(item)
            if kind is plain[key]:  # as its check would pass it: within the bound for its type, a bool as it is
                if kind is bool or (len(item) if kind is str else abs(item)) <= _PLAIN_LIMIT[kind]:
                    continue
            elif item is None and key in may_be_null:
                continue
            check(item, (where, _FIELD, key))

    return checked


def ranged(low: int, high: int):
    return lambda value, where: integer(value, where, low, high)


# ---------------------------------------------------------------- ddpwatch's objects, derived from types.py


@dataclasses.dataclass(frozen=True)
class Limit:
    """The bounds of one field, beyond its type: a number's range, a list's or an object's size, and the same for
    its items (`each`). A bound may depend on the document's world size: a function of it."""

    low: float | Callable[[int], float] | None = None
    high: float | Callable[[int], float] | None = None
    items: int | Callable[[int], int] | None = None
    each: Limit | None = None


def _last_rank(world_size: int) -> int:
    return world_size - 1


def _world(world_size: int) -> int:
    return world_size


TIME = Limit(0.0, MAX_TIME)
RANK = Limit(0, _last_rank)
RANKS = Limit(items=MAX_WORLD_SIZE, each=RANK)
WORLD_SIZE = Limit(MIN_WORLD_SIZE, MAX_WORLD_SIZE)
SHAPES = Limit(items=1024, each=Limit(items=64))
DTYPES = Limit(items=1024)

# (shape, field) -> its bounds; a field not here has its type's defaults (MAX_INT, MAX_NUMBER, MAX_LIST).
LIMITS = {
    ("RecordDoc", "shapes"): SHAPES,
    ("RecordDoc", "dtypes"): DTYPES,
    ("RecordDoc", "start"): TIME,
    ("Stack", "frames"): Limit(items=MAX_FRAMES),
    ("RankState", "rank"): RANK,
    ("RankState", "world_size"): WORLD_SIZE,
    ("RankState", "published_at"): TIME,
    ("RankState", "inflight"): Limit(items=MAX_RECORDS),
    ("RankState", "recent"): Limit(items=MAX_RECORDS),
    ("RankState", "groups"): Limit(each=RANKS),
    ("RankState", "stacks"): Limit(items=MAX_THREADS),
    ("RankState", "progress_bars"): Limit(items=1024),
    ("MismatchRow", "ranks"): RANKS,
    ("MismatchRow", "shapes"): SHAPES,
    ("MismatchRow", "dtypes"): DTYPES,
    ("Finding", "ranks"): RANKS,
    ("IncidentSource", "files"): Limit(items=MAX_WORLD_SIZE),
    ("Incident", "world_size"): WORLD_SIZE,
    ("Incident", "created_at"): TIME,
    ("Incident", "written_by"): RANK,
    ("Incident", "grace"): Limit(low=0.0),
    ("Incident", "timeout"): Limit(low=0.0),
    ("Incident", "ranks"): Limit(items=_world),
    ("Incident", "missing_ranks"): RANKS,
    ("Incident", "findings"): Limit(items=MAX_FINDINGS),
    ("Incident", "rank_conditions"): Limit(items=_world),
    ("FingerprintDoc", "rank"): RANK,
    ("FingerprintGroup", "first"): Limit(low=0),
    ("FingerprintGroup", "ids"): Limit(each=Limit(low=-1)),  # -1: a position missing from the rank's run
    ("FingerprintGroup", "unaligned_from"): Limit(low=0),
    ("FingerprintSignature", "dtypes"): DTYPES,
    ("FingerprintSignature", "counts"): Limit(items=1024, each=Limit(low=0)),
}

# shape -> the keys a reader cannot do without, in the order they are asked for. Fewer than a shape's always-written
# keys: files of older version-1 writers lack some, and a field added to a shape must not make them unreadable.
REQUIRED = {
    "Site": ("file", "line", "function"),
    "Frame": ("file", "line", "function"),
    "Region": ("kind",),
    "RecordDoc": ("seq", "group", "op", "state"),
    "Stack": ("frames",),
    "RankState": ("rank", "world_size"),
    "MismatchRow": ("ranks", "group", "seq", "op"),
    "Finding": ("kind", "ranks", "summary", "fix"),
    "Incident": ("world_size", "ranks", "findings"),
    "FingerprintDoc": ("v", "groups"),
    "FingerprintGroup": ("first", "ids"),
}

# shape -> fields checked before the others: the world size, that the ranks in the document are checked against.
FIRST = {"RankState": ("world_size",), "Incident": ("world_size",)}


def _records_within_limit(state, where: Where) -> None:
    if len(state.get("inflight") or ()) + len(state.get("recent") or ()) > MAX_RECORDS:
        _fail(where, f"more than {MAX_RECORDS} records")


def _each_rank_once(doc, where: Where) -> None:
    seen = [state["rank"] for state in doc["ranks"]]
    if len(set(seen)) != len(seen):
        _fail(_child(where, "ranks"), "a rank appears twice")


def _facts_an_object(finding, where: Where) -> None:
    if "facts" in finding and not isinstance(finding["facts"], dict):  # its values are free: checked as any JSON
        _fail(_child(where, "facts"), f"expected an object, got {_type_name(finding['facts'])}")


# shape -> a check across its fields, after each field passed its own.
ACROSS = {"RankState": _records_within_limit, "Incident": _each_rank_once, "Finding": _facts_an_object}


def _resolved(bound, world_size: int):
    return bound(world_size) if callable(bound) else bound


def _uninterpreted(hint) -> bool:
    """Any anywhere in the type: a field ddpwatch keeps as it is (free)."""
    return hint is Any or any(_uninterpreted(arg) for arg in typing.get_args(hint))


def _refuse_bounds(limit: Limit | None, what: str, *unused: str) -> None:
    """A bound the type cannot have is a mistake in LIMITS, not something to ignore."""
    for attribute in unused:
        if limit is not None and getattr(limit, attribute) is not None:
            raise TypeError(f"validate.LIMITS: {what} cannot have `{attribute}`")


def _scalar_check(hint, limit: Limit | None, world_size: int, what: str):
    if hint is str or hint is bool:
        _refuse_bounds(limit, what, "low", "high", "items", "each")
        return text if hint is str else boolean
    if hint not in (int, float):
        raise TypeError(f"validate.py has no check for {what}: {hint!r}")
    _refuse_bounds(limit, what, "items", "each")
    low = _resolved(limit.low, world_size) if limit and limit.low is not None else None
    high = _resolved(limit.high, world_size) if limit and limit.high is not None else None
    check = integer if hint is int else number
    if low is None and high is None:
        return check  # the type's own range: no wrapper on the most common path
    default = MAX_INT if hint is int else MAX_NUMBER
    return _within(check, -default if low is None else low, default if high is None else high)


def _within(check, low, high):
    return lambda value, where: check(value, where, low, high)


def _check_for(hint, limit: Limit | None, world_size: int, what: str, built: dict):
    """The check of a value of type `hint` (an annotation in types.py) within `limit`; a type this module has no
    check for is a TypeError when the checks are derived, never a field left unchecked."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _uninterpreted(hint):
        _refuse_bounds(limit, what, "low", "high", "items", "each")
        return free
    if origin in (typing.Union, types.UnionType):
        present = [arg for arg in args if arg is not type(None)]
        if len(present) != 1:
            raise TypeError(f"validate.py has no check for {what}: {hint!r}")
        inner = _check_for(present[0], limit, world_size, what, built)
        return nullable(inner) if len(present) < len(args) else inner
    if origin in (list, dict):
        if origin is dict and args[0] is not str:
            raise TypeError(f"validate.py has no check for {what}: JSON keys are strings, not {args[0]!r}")
        _refuse_bounds(limit, what, "low", "high")
        items = _resolved(limit.items, world_size) if limit and limit.items is not None else MAX_LIST
        inner = _check_for(args[-1], limit.each if limit else None, world_size, f"{what} items", built)
        return (list_of if origin is list else dict_of)(inner, items)
    if typing.is_typeddict(hint):
        _refuse_bounds(limit, what, "low", "high", "items", "each")
        return _object(hint, world_size, built)
    return _scalar_check(hint, limit, world_size, what)


def _field_checks(shape, world_size: int, built: dict) -> dict:
    name = shape.__name__
    return {
        key: _check_for(hint, LIMITS.get((name, key)), world_size, f"{name}.{key}", built)
        for key, hint in typing.get_type_hints(shape).items()
    }


def _object(shape, world_size: int, built: dict):
    """The check of one shape: each field by its type and LIMITS, REQUIRED keys, then ACROSS; other keys: free.
    `built` holds the shapes done so far (Site is in many)."""
    if shape not in built:
        name = shape.__name__
        check = fields(_field_checks(shape, world_size, built), REQUIRED.get(name, ()), FIRST.get(name, ()))
        across = ACROSS.get(name)
        built[shape] = check if across is None else _then(check, across)
    return built[shape]


def _then(first, second):
    def checked(value, where: Where) -> None:
        first(value, where)
        second(value, where)

    return checked


def field_checks(shape, world_size: int = 2) -> dict:
    """{field: check} of one shape of types.py, as the validator applies them (for tests)."""
    return _field_checks(shape, world_size, {})


@functools.lru_cache(maxsize=8)
def _document_check(shape_name: str, world_size: int):
    # Imported here: every rank imports this module (through report.py) and most never read a file.
    from . import types as shapes

    return _object(getattr(shapes, shape_name), world_size, {})


def clear_cache() -> None:
    """Forget the checks derived so far (tests that change a shape)."""
    _document_check.cache_clear()
    _published_check.cache_clear()
    _fingerprints_check.cache_clear()


def _world_size(doc, where: Where, required: tuple) -> int:
    """The document's world size, checked first: every rank in it is checked against it."""
    if not isinstance(doc, dict):
        _fail(where, f"expected an object, got {_type_name(doc)}")
    for key in required:
        if key not in doc:
            _fail(where, f"no {key!r}")
    integer(doc["world_size"], _child(where, "world_size"), MIN_WORLD_SIZE, MAX_WORLD_SIZE)  # WORLD_SIZE's bounds
    return doc["world_size"]


def checked(check, doc, path: str) -> None:
    """Run a check on a document read from `path`; its FormatError starts with the path, then the field."""
    try:
        check(doc, "")
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from None


def rank_snapshot(doc: dict, where: Where, world_size: int | None = None) -> None:
    """A rank snapshot (a rank-<r>.json, or one of an incident's `ranks`): ranks below the incident's world size,
    or below the snapshot's own."""
    _world_size(doc, where, REQUIRED["RankState"])
    _document_check("RankState", world_size or doc["world_size"])(doc, where)


def incident(doc: dict, where: Where) -> None:
    """A whole incident (report.json)."""
    _document_check("Incident", _world_size(doc, where, REQUIRED["Incident"]))(doc, where)


@functools.lru_cache(maxsize=8)
def _published_check(world_size: int):
    from . import types as shapes

    return _then(fields(_field_checks(shapes.RankState, world_size, {}), ("rank",)), _records_within_limit)


def published_state(doc, world_size: int) -> bool:
    """Whether a rank's state, position or incident answer read from the job's store may be used: every field
    readers use has its type and bounds (a position leaves some out, so only `rank` is required). Anyone on the
    store's port can write there; a doc that fails is left out, never half read."""
    try:
        _published_check(world_size)(doc, "")
    except FormatError:
        return False
    return True


# What differs rank by rank in records of one call: a position carries it apart from the rest of its records
# (watch/position_text.py). The fields a record must have (REQUIRED) stay with the rest.
RECORD_OWN = ("start", "age_s", "duration_s", "peer")


@functools.lru_cache(maxsize=8)
def _own_check(world_size: int):
    from . import types as shapes

    record = _field_checks(shapes.RecordDoc, world_size, {})
    return fields({key: record[key] for key in RECORD_OWN})


def records_own(entries: list, world_size: int) -> bool:
    """Whether each entry holds only RECORD_OWN fields of a record, each as the record's own check would pass it."""
    check = _own_check(world_size)
    try:
        for entry in entries:
            if not isinstance(entry, dict) or not entry.keys() <= set(RECORD_OWN):
                return False
            check(entry, "")
    except FormatError:
        return False
    return True


def within_record_limit(state: dict) -> bool:
    """The check across a rank state's fields (its records in all), for a state whose fields were checked apart."""
    try:
        _records_within_limit(state, "")
    except FormatError:
        return False
    return True


@functools.lru_cache(maxsize=8)
def _fingerprints_check(world_size: int):
    from . import types as shapes

    return _object(shapes.FingerprintDoc, world_size, {})


def fingerprint_problem(doc, world_size: int) -> str | None:
    """None when a fingerprint document read from the job's store may be compared (watch/fingerprints.py's shape,
    every field of its type and within its bounds); else what is wrong, in one line. Anyone on the store's port can
    write there: a value that fails is left out whole."""
    try:
        _fingerprints_check(world_size)(doc, "")
    except FormatError as exc:
        return str(exc)[:200]
    return None
