"""Writes an incident folder atomically (temp folder, then rename) in every format of RENDERERS; no torch."""

from __future__ import annotations

import json
import os
import re
import traceback

from .. import private, render
from ..format.documents import REPORT_JSON

REPORT_TXT = "report.txt"
REPORT_HTML = "report.html"
TRACE_JSON = "trace.json"


def _render_html(incident: dict) -> str:
    from .html import render_html  # loaded only when a page is written: it is the largest renderer

    return render_html(incident)


def _render_trace(incident: dict) -> str:
    from .trace import render_trace

    return json.dumps(render_trace(incident), default=render.json_default) + "\n"


def _html_note(note: str) -> str:
    return f"<!DOCTYPE html><meta charset=utf-8><pre>{note.replace('<', '&lt;')}</pre>\n"


def _trace_note(note: str) -> str:
    return json.dumps({"traceEvents": [], "otherData": {"error": note}}) + "\n"


# The one table of output formats: name -> (file in an incident folder, renderer, what a failed rendering writes).
# `ddpwatch report --format` offers exactly these; adding a format is one row.
RENDERERS = {
    "text": (REPORT_TXT, render.render_text, str),
    "json": (REPORT_JSON, render.render_json, None),  # the incident itself: never replaced by a note
    "html": (REPORT_HTML, _render_html, _html_note),
    "trace": (TRACE_JSON, _render_trace, _trace_note),
}
FORMATS = tuple(RENDERERS)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def encoded(text: str) -> bytes:
    """UTF-8 that cannot fail: a lone surrogate (a path from os.fsdecode, "\\ud800" in a crafted file) that got this
    far is written as its escape, never raised, so no string costs the incident its files."""
    return text.encode("utf-8", "backslashreplace")


def _write_file(folder_fd: int, name: str, text: str) -> None:
    private.write_new_file(folder_fd, name, encoded(text))


def render_format(incident: dict, fmt: str) -> str:
    """The incident in one of FORMATS (text, json, html, trace: Chrome trace JSON)."""
    if fmt not in RENDERERS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    return RENDERERS[fmt][1](incident)


def _render_or_note(incident: dict, fmt: str) -> str:
    """A renderer bug must not cost the incident its other files: write what went wrong in its place."""
    try:
        return render_format(incident, fmt)
    except Exception:
        note = f"ddpwatch could not render this file ({fmt}); report.json has the whole incident.\n\n"
        return RENDERERS[fmt][2](render.visible(note + traceback.format_exc(), keep_newlines=True))


def _fill(folder_fd: int, incident: dict) -> None:
    """Write every file of the incident into the folder open at `folder_fd` (new files only, no link followed)."""
    for state in incident.get("ranks") or ():
        _write_file(folder_fd, f"rank-{state['rank']}.json",
                    json.dumps(state, default=render.json_default, separators=(",", ":")) + "\n")
    for fmt, (name, renderer, note) in RENDERERS.items():
        _write_file(folder_fd, name, renderer(incident) if note is None else _render_or_note(incident, fmt))


def _place(base_fd: int, base: str, run_id: str, incident: dict) -> str:
    """Fill a private staging folder inside `base`, give it the umask's mode through its descriptor, rename it.

    Whoever can write `base` may swap the staging folder for a symlink at any moment: the files are written and
    the mode set through the descriptor of the folder we made, and the rename happens only while the name still
    is that folder."""
    staging, staging_fd = private.make_private_dir(base_fd, ".incoming-")
    try:
        for attempt in range(1, 1000):
            name = _safe(run_id) + ("" if attempt == 1 else f"-{attempt}")
            if _exists(base_fd, name):
                continue
            final = os.path.join(base, name)
            incident["report_dir"] = os.path.abspath(final)
            _fill(staging_fd, incident)
            os.fchmod(staging_fd, 0o777 & ~_umask())
            if not private.same_entry(base_fd, staging, staging_fd):
                raise private.UnsafeFolder(f"{os.path.join(base, staging)} was replaced while the report was "
                                           "written; someone else can write that folder")
            try:
                os.rename(staging, name, src_dir_fd=base_fd, dst_dir_fd=base_fd)  # readers see none or all of it
            except OSError:
                if _exists(base_fd, name):
                    _empty(staging_fd)
                    continue  # another writer took the name between our check and rename
                raise
            return final
        raise OSError(f"no free incident folder name under {base}")
    except BaseException:
        _remove_staging(base_fd, staging, staging_fd)
        raise
    finally:
        os.close(staging_fd)


def _exists(folder_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _empty(folder_fd: int) -> None:
    for name in os.listdir(folder_fd):
        private.remove_quietly(folder_fd, name)


def _remove_staging(base_fd: int, staging: str, staging_fd: int) -> None:
    """Remove what we wrote; the staging name is removed only while it still is our folder (not a swapped link)."""
    _empty(staging_fd)
    if private.same_entry(base_fd, staging, staging_fd):
        try:
            os.rmdir(staging, dir_fd=base_fd)
        except OSError:
            pass


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask(0) would race other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fallback_dir() -> str:
    """Where reports go when their folder cannot be written: this user's private folder in the temp dir."""
    return os.path.join(private.root_path(), "reports")


def open_fallback(*parts: str) -> int:
    """A descriptor of fallback_dir()/<parts...>, each level private and checked (private.UnsafeFolder if not)."""
    return private.open_private("reports", *parts)


def write_incident(base: str, run_id: str, incident: dict) -> tuple:
    """(folder, note): the folder written; note says where it went instead when `base` was not writable."""
    try:
        fd = private.open_folder(base)
        try:
            return _place(fd, base, run_id, incident), ""
        finally:
            os.close(fd)
    except OSError as exc:
        fd = open_fallback()  # raises UnsafeFolder, saying why, when that folder is not safe
        try:
            folder = _place(fd, fallback_dir(), run_id, incident)
        finally:
            os.close(fd)
        return folder, render.visible(f"could not write under {base} ({exc}); wrote {folder} instead")


# ---------------------------------------------------------------- reading

def refresh_incident(folder: str, incident: dict) -> None:
    """Rewrite an incident folder's files in place with later evidence (native stacks); each file replaced atomically.

    The folder is opened without following a symlink and must be this user's: the files go through its descriptor."""
    parent, name = os.path.split(os.path.abspath(folder))
    parent_fd = os.open(parent, os.O_RDONLY)
    try:
        fd = os.open(name, os.O_RDONLY | private.NOFOLLOW | getattr(os, "O_DIRECTORY", 0), dir_fd=parent_fd)
    finally:
        os.close(parent_fd)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise private.UnsafeFolder(f"{folder} is not yours; ddpwatch will not rewrite it")
        staging, staging_fd = private.make_private_dir(fd, ".refresh-")
        try:
            _fill(staging_fd, incident)
            for entry in os.listdir(staging_fd):
                os.replace(entry, entry, src_dir_fd=staging_fd, dst_dir_fd=fd)
        finally:
            _remove_staging(fd, staging, staging_fd)
            os.close(staging_fd)
    finally:
        os.close(fd)
