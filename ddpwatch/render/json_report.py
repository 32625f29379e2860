"""report.json: the incident itself, for programs; no torch here."""

from __future__ import annotations

import json

from .wording import worded_incident


def json_default(value):
    """For values JSON cannot hold: a tensor-like object becomes its shape and dtype, never its contents."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} shape={list(value.shape)} dtype={value.dtype}>"
    if isinstance(value, (set, frozenset)):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def render_json(incident: dict) -> str:
    """report.json: the incident itself, each finding with its summary and fix worded (as report.json always had)."""
    return json.dumps(worded_incident(incident), indent=1, default=json_default) + "\n"
