"""Call sites on the training thread: which frame is the user's, and a raw site (code, instruction) per record,
resolved to (file, line, function) only when a record is read."""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING

from .. import frames
from ..format import build

if TYPE_CHECKING:  # annotations only
    from ..format.types import Site

# What a frame is, for finding "the user's line": never the user's (ddpwatch, torch, the standard library), an
# installed framework's (lightning, accelerate...: the user called it, it is not the line to change), or the user's.
# The one classifier (frames.py) decides, once per code object; the offline reader asks it the same question.
INTERNAL, LIBRARY, USER = frames.INTERNAL, frames.LIBRARY, frames.USER
installed_package = frames.installed_package
# id(code object) -> (that code object, INTERNAL/LIBRARY/USER). Keyed by id: hashing a code object hashes its
# constants and names on every call (0.1-0.5 us for a training loop's function); the entry keeps the code alive, so
# its id cannot be reused for another.
kind_of_code: dict = {}
last_user_code: list = [None]  # the last code object found to be the user's: the hot path's one-entry cache
# Top-level package names that count as the user's although installed, and ones that count as library although
# not installed (config options user_packages / library_packages, set by the session through configure_frames).
_packages: frames.Packages = frames.NO_PACKAGES
# file name -> whether it is not the user's, for the Flight Recorder's frames (a read places thousands, from a few
# files: the path's normalization was most of the flight feed's work per entry); bounded, cleared with the packages
_internal_by_file: dict = {}
FILE_LIMIT = 4096


def configure_frames(user_packages=(), library_packages=()) -> None:
    """Name packages that count as the user's code (a user's own installed package) or as a library."""
    global _packages
    _packages = frames.packages(user_packages, library_packages)
    _internal_by_file.clear()
    kind_of_code.clear()
    last_user_code[0] = None


def file_kind(filename: str, module: str | None = None) -> int:
    """INTERNAL, LIBRARY or USER for a frame in this file (`module`: the frame's __name__, when known)."""
    return frames.classify(filename, module, frames.THIS_MACHINE, _packages)


def is_internal_file(filename: str) -> bool:
    """Whether a frame in this file is not the user's own code (ddpwatch, torch, stdlib or an installed library)."""
    internal = _internal_by_file.get(filename)
    if internal is None:
        if len(_internal_by_file) >= FILE_LIMIT:
            _internal_by_file.clear()
        internal = _internal_by_file[filename] = file_kind(filename) != USER
    return internal


def code_kind(frame) -> int:
    """INTERNAL, LIBRARY or USER for a frame's code, decided once per code object."""
    code = frame.f_code
    entry = kind_of_code.get(id(code))
    if entry is not None and entry[0] is code:
        return entry[1]
    kind = file_kind(code.co_filename, frame.f_globals.get("__name__"))
    if len(_code_by_id) >= CODE_LIMIT:
        forget_codes()
    kind_of_code[id(code)] = (code, kind)
    _code_by_id[id(code)] = code  # every code a site can name passed here first: its id keeps naming it
    return kind


def user_frame_and_via(frame):
    """(the user's innermost frame, the outermost library frame below it: the framework call it went through)."""
    cache = kind_of_code
    via = None
    while frame is not None:
        code = frame.f_code
        entry = cache.get(id(code))
        kind = entry[1] if entry is not None and entry[0] is code else code_kind(frame)
        if kind == USER:
            return frame, via
        if kind == LIBRARY:
            via = frame
        frame = frame.f_back
    return None, via


def user_frame(frame):
    """The innermost frame of the user's own code (not torch, ddpwatch, the standard library or a library), or None."""
    return user_frame_and_via(frame)[0]


_via_cache: dict = {}  # raw site -> via_site(): a framework's frame is the same few lines, step after step


def cached_via_site(frame) -> tuple | None:
    """via_site(frame), computed once per (code, instruction): the package lookup touches the file system."""
    if frame is None:
        return None
    raw = code_site(frame)
    via = _via_cache.get(raw)
    if via is None:
        via = _via_cache[raw] = via_site(frame)
    return via


def via_site(frame) -> tuple | None:
    """A library frame as (file, line, qualified function, package): "via DDPStrategy.barrier in lightning"."""
    if frame is None:
        return None
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    package = (
        installed_package(os.path.abspath(code.co_filename)) or (frame.f_globals.get("__name__") or "?").split(".")[0]
    )
    return (code.co_filename, frame.f_lineno, name, package)


def frame_site(frame) -> Site | None:
    if frame is None:
        return None
    return build.site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


# A call site on the hot path is (id(code), f_lasti): frame.f_lineno scans the code's line table on every read
# (600+ instructions in a small function, more in a long training loop), f_lasti is a field. The code objects are
# kept here, so an id is never reused while a record or a site count still names it.
_code_by_id: dict = {}
_line_cache: dict = {}  # (id(code), lasti) -> line number
# Code made anew each step (exec'd, generated) would grow the caches above forever. Past CODE_LIMIT code objects,
# on the slow path only (a code seen for the first time), they are emptied but for the codes a record in flight or
# in a ring still names; the site counts are folded into counts by line first, so no raw site outlives its code.
CODE_LIMIT = 1024
recorders: weakref.WeakSet = weakref.WeakSet()


def code_site(frame) -> tuple:
    """The raw site of a frame, cheap: (id(code), offset of its current instruction)."""
    code = frame.f_code
    key = id(code)
    if key not in _code_by_id:
        if len(_code_by_id) >= CODE_LIMIT:
            forget_codes()
        _code_by_id[key] = code
    return (key, frame.f_lasti)


def forget_codes() -> None:
    """Empty the code caches, keeping only the codes that records still name (see CODE_LIMIT)."""
    named = set()
    for recorder in list(recorders):
        named.update(recorder.named_codes())
    kept = {key: code for key, code in _code_by_id.items() if key in named}
    _code_by_id.clear()
    _code_by_id.update(kept)
    kind_of_code.clear()
    last_user_code[0] = None
    _via_cache.clear()
    for raw in [raw for raw in _line_cache if raw[0] not in kept]:
        _line_cache.pop(raw, None)


def _line_at(code, lasti: int) -> int:
    """The line of the instruction at byte offset `lasti`: what frame.f_lineno would have said."""
    import dis  # only when a record is formatted; findlinestarts reads the line table of every Python version

    line = code.co_firstlineno
    for start, start_line in dis.findlinestarts(code):
        if start > lasti:
            break
        if start_line is not None:
            line = start_line
    return line


def resolve_site(raw) -> tuple | None:
    """(file, line, function) of a raw site: the formatting the hot path left for whoever reads the record. A site
    read from the Flight Recorder's frames (watch/flight.py) is that triple already."""
    if raw is None:
        return None
    if len(raw) == 3:
        return raw
    code = _code_by_id.get(raw[0])
    if code is None:
        return None
    line = _line_cache.get(raw)
    if line is None:
        line = _line_cache[raw] = _line_at(code, raw[1])
    return (code.co_filename, line, code.co_name)


def site_dict(raw) -> Site | None:
    site = resolve_site(raw)
    return None if site is None else build.site(*site)
