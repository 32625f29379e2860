"""Reads ddpwatch's own files back: report.json and rank-<r>.json, any readable version, checked; no torch."""

from __future__ import annotations

import os

from .. import snapshot as S
from ..render.report import REPORT_JSON
from ..static import rankcond
from . import bounded, schema

# format_version -> a function that turns a document of that version into the current one. Version 1 is the
# current one; a future version 2 adds an entry `1: _upgrade_1_to_2` here so old folders keep loading.
_UPGRADES: dict = {}


def upgrade(doc: dict) -> dict:
    """Bring a document of any readable version up to FORMAT_VERSION."""
    while doc.get("format_version") != S.FORMAT_VERSION and doc.get("format_version") in _UPGRADES:
        doc = _UPGRADES[doc["format_version"]](doc)
    return doc


def is_incident(doc: dict) -> bool:
    return isinstance(doc.get("ranks"), list) and "findings" in doc


def is_rank_snapshot(doc: dict) -> bool:
    return isinstance(doc.get("rank"), int) and not isinstance(doc.get("rank"), bool) and "findings" not in doc


def load_document(path: str) -> dict:
    """Any ddpwatch JSON file (incident or rank snapshot) of a version this ddpwatch reads, upgraded and checked
    against the schema (FormatError, one line, for anything else)."""
    foreign = f"{path}: not a ddpwatch report.json or rank-<r>.json"
    data = bounded.read_regular(path, schema.MAX_DOCUMENT_BYTES)
    if data[:1] == b"\x80":
        raise S.FormatError(f"{foreign} (a pickle: for Flight Recorder dumps use --flight-recorder FOLDER)")
    try:
        doc = bounded.loads(data, path)
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, S.FormatError):
            raise
        raise S.FormatError(f"{foreign} ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})") from None
    if not isinstance(doc, dict):
        raise S.FormatError(f"{foreign} (JSON {type(doc).__name__}, not an object)")
    doc = upgrade(S.check_version(doc, path))
    if is_incident(doc):
        schema.checked(schema.incident, doc, path)
    elif is_rank_snapshot(doc):
        schema.checked(schema.rank_snapshot, doc, path)
    return doc


def load_incident(folder: str) -> dict:
    """An incident from its folder or its report.json, of any format_version written so far."""
    path = os.path.join(folder, REPORT_JSON) if os.path.isdir(folder) else folder
    doc = load_document(path)
    if not is_incident(doc):
        raise S.FormatError(f"{path}: not a ddpwatch incident (no 'ranks' and 'findings')")
    return doc


def with_rank_conditions(incident: dict) -> dict:
    """An incident written before incidents kept their rank conditions (no `rank_conditions`), with them read now
    from the sources its stacks name, where those still are: reanalysing it words its findings as it did then. The
    analysis reads only the incident; this loader is the one place an old document's sources are read."""
    if "rank_conditions" in incident:
        return incident
    states = {state["rank"]: state for state in incident.get("ranks") or ()}
    captured = rankcond.capture_rank_conditions(states)
    return dict(incident, rank_conditions=captured) if captured else incident
