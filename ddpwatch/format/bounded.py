"""Reads files ddpwatch did not write within bounds: regular files only, never blocking, and a memory budget.

`ddpwatch report` reads files people send each other. A FIFO or a device named rank-0.json would block the read
(or never end), so only regular files are read: stat before opening (opening some devices has effects), opened
with O_NONBLOCK (opening a FIFO for reading waits for a writer), and fstat after (the name may have changed in
between). A symlink is followed, as everywhere a user names a file: what matters is what it points to, which the
checks above see. A folder scan skips what is not a regular file and says so on stderr.

A parser may build far more than it reads: 3 bytes of JSON (`{},`) make a dict of 64 bytes, one pickle opcode a
set of 216 bytes, a 300-byte pickle asks `str` for a gigabyte. So each loader charges a Budget with what it is about
to build (estimated bytes of memory), before building it, and stops at the budget: at most BUILT_PER_BYTE times the
file's size plus BUILT_FLOOR, never more than the caller's cap.
"""

from __future__ import annotations

import json
import os
import stat
import sys

from .version import FormatError

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
BUILT_FLOOR = 64 * 2**20  # what any file may build, however small: far above one rank file (14 KB -> 0.1 MB)


class NotRegular(FormatError):
    """A path that is not a regular file (a FIFO, socket, device or folder): never read."""


class OverBudget(FormatError):
    """A file whose parse would build more than its budget."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _checked_regular(mode: int, path: str) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegular(f"{path}: {_kind(mode)}, not a regular file; ddpwatch reads only regular files")


def open_regular(path: str):
    """A binary file object of the regular file at path; NotRegular (one line) for anything else."""
    _checked_regular(os.stat(path).st_mode, path)
    fd = os.open(path, _READ_FLAGS)
    try:
        _checked_regular(os.fstat(fd).st_mode, path)  # what was opened, if the name changed since the stat
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_within(handle, path: str, limit: int, start: bytes = b"") -> bytes:
    """The rest of an open file after `start` (what was read of it already), refused past `limit` bytes in all."""
    data = start + handle.read(limit + 1 - len(start))
    if len(data) > limit:
        raise FormatError(f"{path}: larger than {limit // 2**20} MiB, the most ddpwatch reads")
    return data


def read_regular(path: str, limit: int) -> bytes:
    """A regular file's bytes, refused (FormatError) past `limit` before anything is parsed."""
    with open_regular(path) as handle:
        return read_within(handle, path, limit)


def regular_or_skipped(path: str, stderr=None) -> bool:
    """For folder scans: whether path is a regular file; if not (or gone), one line on stderr says it is skipped."""
    try:
        _checked_regular(os.stat(path).st_mode, path)
        return True
    except (OSError, NotRegular) as exc:
        print(f"ddpwatch: skipped {exc}", file=stderr or sys.stderr)
        return False


class Budget:
    """Estimated bytes a loader may still build from one file; charge() before building, OverBudget past it."""

    def __init__(self, where: str, size: int, cap: int, per_byte: int):
        self.where, self.used = where, 0
        self.limit = min(cap, BUILT_FLOOR + per_byte * size)

    def charge(self, cost: int) -> None:
        self.used += cost
        if self.used > self.limit:
            raise OverBudget(
                f"{self.where}: would build more than {self.limit // 2**20} MiB in memory, the most "
                "ddpwatch builds from a file this size (crafted or damaged)"
            )


# ---------------------------------------------------------------- JSON

# What json.loads builds, per token, as measured on CPython 3.11 (a dict with keys 224 bytes, a list 56 + 8 a
# slot, a number or string about 48 with its slot); counted in the raw bytes, strings included (an overcount).
JSON_TOKEN_COST = ((b"{", 240), (b"[", 72), (b",", 48))


def json_build_estimate(data: bytes) -> int:
    """Bytes of memory json.loads would build from `data`, estimated at C speed before parsing (files, the store)."""
    return sum(cost * data.count(token) for token, cost in JSON_TOKEN_COST)


# ddpwatch's own 16,384-rank incident (report.json of 191 MiB: 1.2 M `{`, 1.5 M `[`, 10.8 M `,`) estimates
# (json_build_estimate) at 916 MiB and took 830 MiB to parse (peak RSS less the file read twice): 4.8
# estimated bytes per file byte, so JSON_BUILT_PER_BYTE = 12 leaves 2.5 times that; a list of rank numbers
# ("16383,") comes to 8. `{},` is 96.
JSON_BUILT_PER_BYTE = 12
JSON_BUILT_CAP = 2 * 2**30


def loads(data: bytes, where: str):
    """JSON from bytes within a budget counted before parsing; NaN and Infinity refused (they are not JSON), deep
    nesting an error, not a crash (the C parser stops at the interpreter's recursion limit, about 1000 levels)."""
    Budget(where, len(data), JSON_BUILT_CAP, JSON_BUILT_PER_BYTE).charge(json_build_estimate(data))

    def no_constants(token):
        raise FormatError(f"{where}: {token} is not a JSON number")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=no_constants)
    except RecursionError:
        raise FormatError(f"{where}: nested too deeply") from None
    except MemoryError:
        raise FormatError(f"{where}: too large to load into memory") from None
