"""Finds, reads and checks Flight Recorder dump files (pickle or JSON, one per rank) within size and shape limits."""

from __future__ import annotations

import json
import os
import pickle
import re
import struct

from ..format import bounded, validate
from ..format.version import FormatError
from .safe_pickle import PICKLE_BUILT_CAP, PICKLE_BUILT_PER_BYTE, safe_unpickle  # noqa: F401 (names of this reader)

# A dump file is named <prefix><rank> (TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE convention).
DUMP_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")


class FlightRecorderError(FormatError):
    """A file or folder that holds no Flight Recorder dump ddpwatch can read."""


class NotADump(FlightRecorderError):
    """A file that is plainly something else (no pickle or JSON object, or no 'entries'): skipped in a folder."""


# ---------------------------------------------------------------- reading files safely

MAX_DUMP_BYTES = 128 * 2**20  # one dump file (torch's default 2000 entries with frames: a few MB)
MAX_ENTRIES = 200_000  # entries of one dump
MAX_FRAMES_PER_ENTRY = 1024
MAX_FRAMES = 2_000_000  # frames of one dump, all entries together (shared objects counted each time)


def _parse(path: str, data: bytes):
    """The dump's object from pickle or JSON bytes; NotADump when the bytes are plainly neither."""
    if data[:1] == b"\x80":  # pickle protocol 2+ marker
        return safe_unpickle(data, path)
    if data.lstrip()[:1] == b"{":
        return bounded.loads(data, path)
    raise NotADump(f"{path}: not a Flight Recorder dump (neither pickle nor JSON)")


def _reason(exc: BaseException) -> str:
    """Why a dump could not be parsed, never empty: a truncated pickle raises EOFError() with no message, and a cut
    inside an opcode's argument struct.error's words about buffer sizes."""
    if isinstance(exc, (EOFError, struct.error)):
        return "it ends early (truncated: cut off while written or copied?)"
    text = str(exc)
    if isinstance(exc, (RecursionError, MemoryError)) or not text:
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def load_dump(path: str) -> dict:
    """One dump file, pickle (from _dump_fr_trace) or JSON (from _dump_fr_trace_json), checked (check_dump)."""
    with bounded.open_regular(path) as handle:
        head = handle.read(64)
        if head.lstrip()[:1] not in (b"\x80", b"{"):
            raise NotADump(f"{path}: not a Flight Recorder dump (neither pickle nor JSON)")
        data = bounded.read_within(handle, path, MAX_DUMP_BYTES, head)
    try:
        dump = _parse(path, data)
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        UnicodeDecodeError,
        AttributeError,
        IndexError,
        KeyError,
        RecursionError,
        MemoryError,
        OverflowError,
        struct.error,
    ) as exc:
        if isinstance(exc, FormatError):
            raise FlightRecorderError(str(exc)) from None
        raise FlightRecorderError(f"{path}: unreadable Flight Recorder dump ({_reason(exc)[:200]})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), (list, tuple)):
        raise NotADump(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    try:
        check_dump(dump, path)
    except FormatError as exc:
        raise FlightRecorderError(str(exc)) from None
    return dump


# What ddpwatch reads of a dump, checked before anything is read from it (torch's field names).
_ints = validate.list_of(validate.integer, 64)
_FRAME = validate.fields(
    {
        "name": validate.nullable(validate.text),
        "filename": validate.nullable(validate.text),
        "file": validate.nullable(validate.text),
        "function": validate.nullable(validate.text),
        "line": validate.nullable(validate.integer),
    }
)
_ENTRY = validate.fields(
    {
        "record_id": validate.nullable(validate.integer),
        "pg_id": validate.nullable(validate.name),
        "process_group": validate.nullable(validate.list_of(validate.nullable(validate.name), 8)),
        "collective_seq_id": validate.nullable(validate.integer),
        "p2p_seq_id": validate.nullable(validate.integer),
        "profiling_name": validate.nullable(validate.text),
        "time_created_ns": validate.nullable(validate.ranged(0, 2**63)),
        "time_discovered_completed_ns": validate.nullable(validate.ranged(0, 2**63)),
        "input_sizes": validate.nullable(validate.list_of(_ints, 1024)),
        "input_dtypes": validate.nullable(validate.list_of(validate.text, 1024)),
        "state": validate.nullable(validate.text),
        "retired": validate.nullable(validate.boolean),
        "is_p2p": validate.nullable(validate.boolean),
        "thread_name": validate.nullable(validate.text),
        "frames": validate.nullable(validate.list_of(_FRAME, MAX_FRAMES_PER_ENTRY)),
    }
)
_GROUP = validate.fields(
    {
        "name": validate.nullable(validate.name),
        "desc": validate.nullable(validate.text),
        "ranks": validate.nullable(lambda value, where: _checked_ranks(value, where)),
    }
)
_STATUS = validate.fields({"last_completed_collective": validate.nullable(lambda value, where: _counter(value, where))})


def _counter(value, where: str) -> None:
    """A sequence counter: an integer in pickles, its decimal text in JSON dumps ("3")."""
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value):
        value = int(value)
    validate.integer(value, where)


def _checked_ranks(value, where: str) -> None:
    if parse_ranks(value) is None and value not in ("", []):
        raise FormatError(f"{where}: not a list of ranks 0..{validate.MAX_WORLD_SIZE - 1}")


def parse_ranks(value) -> list | None:
    """A pg_config `ranks` value (a JSON text, or a list) as a list of ranks in range; None if it is not one."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if len(value) <= validate.MAX_STRING else None
        except (ValueError, RecursionError):
            return None
    if (
        isinstance(value, (list, tuple))
        and len(value) <= validate.MAX_WORLD_SIZE
        and all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < validate.MAX_WORLD_SIZE for r in value)
    ):
        return list(value)
    return None


def _version(value, where: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        validate.number(value, where)
    else:
        validate.text(value, where)


def check_dump(dump: dict, path: str) -> None:
    """The fields ddpwatch reads, with their types and limits: FormatError (one line) for anything else."""
    validate.checked(_check_dump, dump, path)


def _check_dump(dump: dict, where: str) -> None:
    entries = dump["entries"]
    if len(entries) > MAX_ENTRIES:
        raise FormatError(f"{len(entries)} entries (at most {MAX_ENTRIES})")
    frames = sum(len(e["frames"]) for e in entries if isinstance(e, dict) and isinstance(e.get("frames"), list))
    if frames > MAX_FRAMES:  # counted before anything is walked: one shared entry repeated costs 2 bytes a time
        raise FormatError(f"{frames} frames in all (at most {MAX_FRAMES})")
    for index, entry in enumerate(entries):
        key = "p2p_seq_id" if isinstance(entry, dict) and entry.get("is_p2p") else "collective_seq_id"
        if isinstance(entry, dict) and not isinstance(entry.get(key), int):
            raise FormatError(f"entries[{index}].{key}: expected an integer, got {type(entry.get(key)).__name__}")
    validate.fields(
        {
            "version": validate.nullable(_version),
            "entries": validate.list_of(_ENTRY, MAX_ENTRIES),
            "pg_config": validate.nullable(validate.dict_of(validate.nullable(_GROUP))),
            "pg_status": validate.nullable(validate.dict_of(validate.nullable(_STATUS))),
        }
    )(dump, where)


# ---------------------------------------------------------------- the dumps of a folder


def _candidates(folder: str) -> list:
    """(rank, path) for files named <prefix><rank> under folder, recursively; hidden files and folders, and what is
    not a regular file, skipped."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            match = DUMP_NAME.match(name)
            path = os.path.join(root, name)
            if match and not name.startswith(".") and bounded.regular_or_skipped(path):  # a FIFO would block
                found.append((int(match.group("rank")), path))
    return found


def find_dumps(folders: list) -> dict:
    """rank -> (dump, path); a pickle beats a JSON dump of the same rank (only the pickle has stacks)."""
    chosen: dict = {}
    for folder in folders:
        if not os.path.isdir(folder):
            raise FlightRecorderError(f"{folder}: no such folder")
        for rank, path in _candidates(folder):
            try:
                dump = load_dump(path)
            except NotADump:
                continue  # other files may sit beside the dumps (logs, checkpoints); a damaged dump is an error
            if rank >= validate.MAX_WORLD_SIZE:
                raise FlightRecorderError(
                    f"{path}: rank {rank} from the file name is beyond {validate.MAX_WORLD_SIZE - 1}"
                )
            if rank in chosen:
                if _has_frames(chosen[rank][0]) and not _has_frames(dump):
                    continue
                if _has_frames(chosen[rank][0]) == _has_frames(dump):
                    raise FlightRecorderError(
                        f"two Flight Recorder dumps for rank {rank}: {chosen[rank][1]} and {path}"
                    )
            chosen[rank] = (dump, path)
    if not chosen:
        raise FlightRecorderError(f"no Flight Recorder dump (files named <prefix><rank>) under {', '.join(folders)}")
    return chosen


def _has_frames(dump: dict) -> bool:
    return any(entry.get("frames") for entry in dump.get("entries") or ())
