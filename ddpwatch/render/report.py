"""An incident as the files of its folder, in every format of RENDERERS (pure), for the atomic writer; no torch."""

from __future__ import annotations

import json
import os
import re
import traceback

from .. import atomic, private
from . import json_report, text
from ..format import documents
from ..format.documents import REPORT_JSON
from ..terminal import visible

REPORT_TXT = "report.txt"
REPORT_HTML = "report.html"
TRACE_JSON = "trace.json"


def _render_html(incident: dict) -> str:
    from .html import render_html  # loaded only when a page is written: it is the largest renderer

    return render_html(incident)


def _render_trace(incident: dict) -> str:
    from .trace import render_trace

    return json.dumps(render_trace(incident), default=documents.json_default) + "\n"


def _html_note(note: str) -> str:
    return f"<!DOCTYPE html><meta charset=utf-8><pre>{note.replace('<', '&lt;')}</pre>\n"


def _trace_note(note: str) -> str:
    return json.dumps({"traceEvents": [], "otherData": {"error": note}}) + "\n"


# The one table of output formats: name -> (file in an incident folder, renderer, what a failed rendering writes).
# `ddpwatch report --format` offers exactly these; adding a format is one row.
RENDERERS = {
    "text": (REPORT_TXT, text.render_text, str),
    "json": (REPORT_JSON, json_report.render_json, None),  # the incident itself: never replaced by a note
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


def render_format(incident: dict, fmt: str) -> str:
    """The incident in one of FORMATS (text, json, html, trace: Chrome trace JSON)."""
    if fmt not in RENDERERS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(RENDERERS)}")
    return RENDERERS[fmt][1](incident)


def _render_or_note(incident: dict, fmt: str) -> str:
    """A renderer bug must not cost the incident its other files: write what went wrong in its place."""
    try:
        return render_format(incident, fmt)
    except Exception:
        note = f"ddpwatch could not render this file ({fmt}); report.json has the whole incident.\n\n"
        return RENDERERS[fmt][2](visible(note + traceback.format_exc(), keep_newlines=True))


def incident_files(incident: dict) -> dict:
    """name -> bytes of every file of an incident folder: each rank's state, then every format of RENDERERS."""
    files = {}
    for state in incident.get("ranks") or ():
        files[documents.rank_file_name(state["rank"])] = documents.rank_file_bytes(state)
    for fmt, (name, renderer, note) in RENDERERS.items():
        files[name] = encoded(renderer(incident) if note is None else _render_or_note(incident, fmt))
    return files


def _fill(folder_fd: int, incident: dict) -> None:
    """Write every file of the incident into the folder open at `folder_fd` (new files only, no link followed)."""
    atomic.write_new_files(folder_fd, incident_files(incident))


def _place(base_fd: int, base: str, run_id: str, incident: dict) -> str:
    """The incident's folder, named after the run (`-2`, `-3`... when taken), written whole by the atomic writer."""
    names = (_safe(run_id) + ("" if attempt == 1 else f"-{attempt}") for attempt in range(1, 1000))

    def fill(staging_fd: int, final: str) -> None:
        incident["report_dir"] = os.path.abspath(final)
        _fill(staging_fd, incident)

    return atomic.place_folder(base_fd, base, names, fill)


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
        return folder, visible(f"could not write under {base} ({exc}); wrote {folder} instead")


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
        atomic.replace_files(fd, incident_files(incident))
    finally:
        os.close(fd)
