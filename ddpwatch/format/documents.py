"""Load and save ddpwatch's own documents: report.json, rank-<r>.json and the incident folder that holds them, any
readable version, checked; no torch. The one place that encodes and writes an incident folder."""

from __future__ import annotations

import json
import os
import re
import threading
from typing import TYPE_CHECKING, cast

from .. import atomic, private
from ..terminal import visible
from . import bounded, validate
from .upgrade import upgrade
from .version import FormatError, check_version

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from .types import Incident

REPORT_JSON = "report.json"  # the incident itself, in its folder (render.report.RENDERERS names it there)
# Each rank's native stacks (py-spy), added to the incident folder once its report files are there: reading them
# pauses the process read, so the report does not wait for them.
NATIVE_JSON = "native.json"
NATIVE_VERSION = 1
NOWHERE = "(nowhere: no writable directory)"  # where a rank's local dump went when no folder took it


# One encoder, made once: json.dumps with any option builds a new JSONEncoder per call (every heartbeat).
_encode = json.JSONEncoder(default=repr, separators=(",", ":")).encode


def dumps(doc: dict) -> str:
    """Serialise a snapshot or incident; anything not JSON-native becomes its repr rather than an error."""
    return _encode(doc)


def encoded(text: str) -> bytes:
    """UTF-8 that cannot fail: a lone surrogate (a path from os.fsdecode, "\\ud800" in a crafted file) that got this
    far is written as its escape, never raised, so no string costs the incident its files."""
    return text.encode("utf-8", "backslashreplace")


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
    """rank-<r>.json, the one encoder of a rank's state on disk (an incident folder, a rank's local dump), and of
    native.json: values JSON cannot hold as json_default says, and UTF-8 that cannot fail (a lone surrogate is
    written as its escape)."""
    return encoded(json.dumps(state, default=json_default, separators=(",", ":")) + "\n")


def report_json_text(incident: dict) -> str:
    """report.json, the one encoder of an incident (render.json_report words its findings first)."""
    return json.dumps(incident, indent=1, default=json_default) + "\n"


# ---------------------------------------------------------------- saving


def incident_files(incident: dict, renderings) -> dict:
    """name -> bytes of every file of an incident folder: each rank's state, then `renderings(incident)` (file name
    -> text: render.report.renderings, report.json among them)."""
    files = {rank_file_name(state["rank"]): rank_file_bytes(state) for state in incident.get("ranks") or ()}
    files.update((name, encoded(text)) for name, text in renderings(incident).items())
    return files


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def _fill(folder_fd: int, incident: dict, renderings) -> None:
    """Write every file of the incident into the folder open at `folder_fd` (new files only, no link followed)."""
    atomic.write_new_files(folder_fd, incident_files(incident, renderings))


def _place(base_fd: int, base: str, run_id: str, incident: dict, renderings) -> str:
    """The incident's folder, named after the run (`-2`, `-3`... when taken), written whole by the atomic writer."""
    names = (_safe(run_id) + ("" if attempt == 1 else f"-{attempt}") for attempt in range(1, 1000))

    def fill(staging_fd: int, final: str) -> None:
        incident["report_dir"] = os.path.abspath(final)
        _fill(staging_fd, incident, renderings)

    return atomic.place_folder(base_fd, base, names, fill)


def fallback_dir() -> str:
    """Where reports go when their folder cannot be written: this user's private folder in the temp dir."""
    return os.path.join(private.root_path(), "reports")


def open_fallback(*parts: str) -> int:
    """A descriptor of fallback_dir()/<parts...>, each level private and checked (private.UnsafeFolder if not)."""
    return private.open_private("reports", *parts)


def save_incident(base: str, run_id: str, incident: dict, renderings) -> tuple:
    """(folder, note): the incident's folder under `base`, written once and whole (its `report_dir` set to it); note
    says where it went instead when `base` was not writable. `renderings`: see incident_files."""
    try:
        fd = private.open_folder(base)
        try:
            return _place(fd, base, run_id, incident, renderings), ""
        finally:
            os.close(fd)
    except OSError as exc:
        fd = open_fallback()  # raises UnsafeFolder, saying why, when that folder is not safe
        try:
            folder = _place(fd, fallback_dir(), run_id, incident, renderings)
        finally:
            os.close(fd)
        return folder, visible(f"could not write under {base} ({exc}); wrote {folder} instead")


def save_rank_dump(folder: str, doc: dict) -> str:
    """rank-<r>.json in `folder`, written whole or not at all (temp file + rename), with the umask's mode; else in
    this user's private temp folder; a failed write (full disk) leaves no temp file behind. Its path, or NOWHERE."""
    data = rank_file_bytes(doc)
    name, sub = rank_file_name(doc["rank"]), os.path.basename(folder)
    places = (
        (folder, lambda: private.open_subfolder(folder)),
        (os.path.join(fallback_dir(), sub), lambda: open_fallback(sub)),
    )
    for base, open_base in places:
        try:
            fd = open_base()
        except OSError:
            continue
        try:
            atomic.write_file(fd, name, data, temp=f".rank-{doc['rank']}-{os.getpid()}-{threading.get_ident()}.tmp")
            return os.path.join(base, name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return NOWHERE


def save_native_stacks(folder: str, run_id: str, natives: dict) -> str:
    """native.json in the incident `folder`, written whole (temp file + rename): {"native_version", "run_id",
    "ranks": {"<rank>": py-spy's dump}}. Its path; OSError or private.UnsafeFolder when it cannot be written."""
    doc = {"native_version": NATIVE_VERSION, "run_id": run_id, "ranks": {str(r): natives[r] for r in sorted(natives)}}
    data = rank_file_bytes(doc)  # the same compact encoding as the rank files beside it
    fd = private.open_subfolder(folder)
    try:
        atomic.write_file(fd, NATIVE_JSON, data, temp=f".native-{os.getpid()}-{threading.get_ident()}.tmp")
    finally:
        os.close(fd)
    return os.path.join(folder, NATIVE_JSON)


# ---------------------------------------------------------------- loading


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


def as_incident(doc: dict) -> Incident | None:
    """A document load_document() returned, as the incident it is; None when it is not one."""
    # load_document checked an incident against the schema types.Incident defines (validate.incident) before
    # returning it: what the type checker cannot follow from a dict read from JSON.
    return cast("Incident", doc) if is_incident(doc) else None


def load_incident(folder: str) -> Incident:
    """An incident from its folder or its report.json, of any format_version written so far."""
    path = os.path.join(folder, REPORT_JSON) if os.path.isdir(folder) else folder
    incident = as_incident(load_document(path))
    if incident is None:
        raise FormatError(f"{path}: not a ddpwatch incident (no 'ranks' and 'findings')")
    with_native_stacks(cast(dict, incident), os.path.join(os.path.dirname(path), NATIVE_JSON))
    return incident


def with_native_stacks(incident: dict, path: str) -> None:
    """Each rank's native stacks from the folder's native.json into its state, where that file is there, of this
    run, and readable; else the incident stays as its report.json has it (the native stacks are evidence added
    after the report, never a condition for reading it)."""
    try:
        doc = bounded.loads(bounded.read_regular(path, validate.MAX_DOCUMENT_BYTES), path)
    except (OSError, ValueError, UnicodeDecodeError):
        return
    if (
        not isinstance(doc, dict)
        or doc.get("native_version") != NATIVE_VERSION
        or doc.get("run_id") != incident.get("run_id")
    ):
        return
    ranks = doc.get("ranks")
    if not isinstance(ranks, dict):
        return
    for state in incident.get("ranks") or ():
        native = ranks.get(str(state.get("rank")))
        if isinstance(native, dict) and "native" not in state:
            state["native"] = native
