"""report.json: the incident itself, for programs; no torch here."""

from __future__ import annotations

import json

from ..format.documents import json_default
from .wording import worded_incident


def render_json(incident: dict) -> str:
    """report.json: the incident itself, each finding with its summary and fix worded (as report.json always had)."""
    return json.dumps(worded_incident(incident), indent=1, default=json_default) + "\n"
