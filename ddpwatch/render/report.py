"""An incident rendered in every format of RENDERERS: text for its folder (format.documents writes it); no torch."""

from __future__ import annotations

import json
import traceback
from typing import TYPE_CHECKING, Callable, cast

from . import json_report, text
from ..format import documents
from ..format.documents import REPORT_JSON
from ..terminal import visible

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import Incident

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


def _plain(incident: Incident) -> dict:
    # The renderers (and render/wording.py, which they call) take a plain dict still. An Incident is one at run
    # time; the type checker keeps TypedDicts apart from dict (a dict's own methods could break their keys).
    return cast(dict, incident)


def render_format(incident: Incident, fmt: str) -> str:
    """The incident in one of FORMATS (text, json, html, trace: Chrome trace JSON)."""
    if fmt not in RENDERERS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(RENDERERS)}")
    return RENDERERS[fmt][1](_plain(incident))


def _render_or_note(incident: Incident, fmt: str, note_of: Callable[[str], str]) -> str:
    """A renderer bug must not cost the incident its other files: write what went wrong in its place
    (`note_of`: the format's row of RENDERERS says how)."""
    try:
        return render_format(incident, fmt)
    except Exception:
        note = f"ddpwatch could not render this file ({fmt}); report.json has the whole incident.\n\n"
        return note_of(visible(note + traceback.format_exc(), keep_newlines=True))


def renderings(incident: Incident) -> dict:
    """file name -> text of every format of RENDERERS, for the incident's folder (format.documents writes it)."""
    return {
        name: renderer(_plain(incident)) if note is None else _render_or_note(incident, fmt, note)
        for fmt, (name, renderer, note) in RENDERERS.items()
    }
