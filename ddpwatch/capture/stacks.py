"""Every thread's Python stack, as plain data, each frame marked the user's, a library's or internal."""

from __future__ import annotations

import sys
import threading
from types import FrameType

from .sites import LIBRARY, USER, code_kind


def python_stacks(skip_thread: int | None = None, limit: int = 60) -> list:
    """Every thread's Python stack, main thread first, innermost frame last; each frame marked internal or not."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main_ident = threading.main_thread().ident
    stacks = []
    for ident, innermost in sys._current_frames().items():
        if ident == skip_thread:
            continue
        frames: list = []
        frame: FrameType | None = innermost
        while frame is not None and len(frames) < limit:
            code = frame.f_code
            kind = code_kind(frame)
            entry = {
                "file": code.co_filename,
                "line": frame.f_lineno,
                "function": code.co_name,
                "internal": kind != USER,
            }
            if kind == LIBRARY:
                entry["library"] = True
            frames.append(entry)
            frame = frame.f_back
        frames.reverse()
        stacks.append({"thread": names.get(ident, f"thread-{ident}"), "main": ident == main_ident, "frames": frames})
    stacks.sort(key=lambda s: (not s["main"], s["thread"]))
    return stacks
