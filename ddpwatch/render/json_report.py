"""report.json: the incident itself, for programs; no torch here."""

from __future__ import annotations

from ..format.documents import report_json_text
from .wording import worded_incident


def render_json(incident: dict) -> str:
    """report.json: the incident itself, each finding with its summary and fix worded (as report.json always had)."""
    return report_json_text(worded_incident(incident))
