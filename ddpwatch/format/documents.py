"""Load and save ddpwatch's own documents: report.json and rank-<r>.json, any readable version, checked; no torch."""

from __future__ import annotations

import json
import os

from . import bounded, validate
from .upgrade import upgrade
from .version import FormatError, check_version

REPORT_JSON = "report.json"  # the incident itself, in its folder (render.report.RENDERERS names it there)


# One encoder, made once: json.dumps with any option builds a new JSONEncoder per call (every heartbeat).
_encode = json.JSONEncoder(default=repr, separators=(",", ":")).encode


def dumps(doc: dict) -> str:
    """Serialise a snapshot or incident; anything not JSON-native becomes its repr rather than an error."""
    return _encode(doc)


def json_default(value):
    """For values JSON cannot hold: a tensor-like object becomes its shape and dtype, never its contents."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} shape={list(value.shape)} dtype={value.dtype}>"
    if isinstance(value, (set, frozenset)):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def rank_file_name(rank: int) -> str:
    return f"rank-{rank}.json"


def rank_file_bytes(state: dict) -> bytes:
    """rank-<r>.json, the one encoder of a rank's state on disk (an incident folder, a rank's local dump): values JSON
    cannot hold as json_default says, and UTF-8 that cannot fail (a lone surrogate is written as its escape)."""
    text = json.dumps(state, default=json_default, separators=(",", ":")) + "\n"
    return text.encode("utf-8", "backslashreplace")


def load_json_text(text: str, what: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{what}: not valid JSON ({exc})") from None
    return check_version(doc, what)


def is_incident(doc: dict) -> bool:
    return isinstance(doc.get("ranks"), list) and "findings" in doc


def is_rank_snapshot(doc: dict) -> bool:
    return isinstance(doc.get("rank"), int) and not isinstance(doc.get("rank"), bool) and "findings" not in doc


def load_document(path: str) -> dict:
    """Any ddpwatch JSON file (incident or rank snapshot) of a version this ddpwatch reads, upgraded and checked
    against the schema (FormatError, one line, for anything else)."""
    foreign = f"{path}: not a ddpwatch report.json or rank-<r>.json"
    data = bounded.read_regular(path, validate.MAX_DOCUMENT_BYTES)
    if data[:1] == b"\x80":
        raise FormatError(f"{foreign} (a pickle: for Flight Recorder dumps use --flight-recorder FOLDER)")
    try:
        doc = bounded.loads(data, path)
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{foreign} ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})") from None
    if not isinstance(doc, dict):
        raise FormatError(f"{foreign} (JSON {type(doc).__name__}, not an object)")
    doc = upgrade(check_version(doc, path))
    if is_incident(doc):
        validate.checked(validate.incident, doc, path)
    elif is_rank_snapshot(doc):
        validate.checked(validate.rank_snapshot, doc, path)
    return doc


def load_incident(folder: str) -> dict:
    """An incident from its folder or its report.json, of any format_version written so far."""
    path = os.path.join(folder, REPORT_JSON) if os.path.isdir(folder) else folder
    doc = load_document(path)
    if not is_incident(doc):
        raise FormatError(f"{path}: not a ddpwatch incident (no 'ranks' and 'findings')")
    return doc

