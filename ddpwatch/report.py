"""Writes an incident folder atomically (temp folder, then rename), loads it back, runs `ddpwatch report`; no torch."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import traceback

from . import render, snapshot as S

REPORT_TXT = "report.txt"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
TRACE_JSON = "trace.json"
FORMATS = ("text", "json", "html", "trace")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def _write_file(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def render_format(incident: dict, fmt: str) -> str:
    """The incident as text, json, html or trace (Chrome trace JSON)."""
    if fmt == "text":
        return render.render_text(incident)
    if fmt == "json":
        return render.render_json(incident)
    if fmt == "html":
        from .html_report import render_html

        return render_html(incident)
    if fmt == "trace":
        from .trace import render_trace

        return json.dumps(render_trace(incident), default=render.json_default) + "\n"
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def _render_or_note(incident: dict, fmt: str) -> str:
    """A renderer bug must not cost the incident its other files: write what went wrong in its place."""
    try:
        return render_format(incident, fmt)
    except Exception:
        note = f"ddpwatch could not render this file ({fmt}); report.json has the whole incident.\n"
        detail = traceback.format_exc()
        if fmt == "html":
            return f"<!DOCTYPE html><meta charset=utf-8><pre>{note}\n{detail.replace('<', '&lt;')}</pre>\n"
        if fmt == "trace":
            return json.dumps({"traceEvents": [], "otherData": {"error": note + detail}}) + "\n"
        return note + detail


def _fill(folder: str, incident: dict) -> None:
    for state in incident.get("ranks") or ():
        _write_file(os.path.join(folder, f"rank-{state['rank']}.json"),
                    json.dumps(state, default=render.json_default, separators=(",", ":")) + "\n")
    _write_file(os.path.join(folder, REPORT_JSON), render.render_json(incident))
    for name, fmt in ((REPORT_TXT, "text"), (REPORT_HTML, "html"), (TRACE_JSON, "trace")):
        _write_file(os.path.join(folder, name), _render_or_note(incident, fmt))


def _place(base: str, run_id: str, incident: dict) -> str:
    os.makedirs(base, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".incoming-", dir=base)
    try:
        for attempt in range(1, 1000):
            name = _safe(run_id) + ("" if attempt == 1 else f"-{attempt}")
            final = os.path.join(base, name)
            if os.path.exists(final):
                continue
            incident["report_dir"] = os.path.abspath(final)
            _fill(staging, incident)
            os.chmod(staging, 0o777 & ~_umask())
            try:
                os.rename(staging, final)  # atomic: readers see no folder or a whole one
            except OSError:
                if os.path.exists(final):
                    continue  # another writer took the name between our check and rename
                raise
            return final
        raise OSError(f"no free incident folder name under {base}")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


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


def write_incident(base: str, run_id: str, incident: dict) -> tuple:
    """(folder, note): the folder written; note says where it went instead when `base` was not writable."""
    try:
        return _place(base, run_id, incident), ""
    except OSError as exc:
        fallback = os.path.join(tempfile.gettempdir(), "ddpwatch-reports")
        folder = _place(fallback, run_id, incident)
        return folder, f"could not write under {base} ({exc}); wrote {folder} instead"


# ---------------------------------------------------------------- reading

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
    """Any ddpwatch JSON file (incident or rank snapshot) of a version this ddpwatch reads, upgraded."""
    foreign = f"{path}: not a ddpwatch report.json or rank-<r>.json"
    with open(path, "rb") as handle:
        data = handle.read()
    if data[:1] == b"\x80":
        raise S.FormatError(f"{foreign} (a pickle: for Flight Recorder dumps use --flight-recorder FOLDER)")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise S.FormatError(f"{foreign} ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})") from None
    if not isinstance(doc, dict):
        raise S.FormatError(f"{foreign} (JSON {type(doc).__name__}, not an object)")
    return upgrade(S.check_version(doc, path))


def load_incident(folder: str) -> dict:
    """An incident from its folder or its report.json, of any format_version written so far."""
    path = os.path.join(folder, REPORT_JSON) if os.path.isdir(folder) else folder
    doc = load_document(path)
    if not is_incident(doc):
        raise S.FormatError(f"{path}: not a ddpwatch incident (no 'ranks' and 'findings')")
    return doc


# ---------------------------------------------------------------- `ddpwatch report`

class ReportError(Exception):
    """A problem with the command's input, said in one line."""


def _single_incident_path(paths: list) -> str | None:
    """The report.json to re-render when the one path given is an incident folder or a report.json file."""
    if len(paths) != 1:
        return None
    path = paths[0]
    if os.path.isdir(path):
        return os.path.join(path, REPORT_JSON) if os.path.isfile(os.path.join(path, REPORT_JSON)) else None
    doc = load_document(path)
    return path if is_incident(doc) else None


def _reanalyze(incident: dict, grace: float | None, timeout: float | None) -> dict:
    from .incident import reanalyze

    return reanalyze(incident, grace, timeout)


def build_incident(args) -> dict:
    """The incident the command renders: a saved one, merged rank files, or Flight Recorder dumps."""
    paths = list(args.path or [])
    fr_dirs = list(getattr(args, "flight_recorder", None) or [])
    grace, timeout = getattr(args, "grace", None), getattr(args, "timeout", None)
    if fr_dirs and paths:
        raise ReportError("give either incident/rank-file paths or --flight-recorder folders, not both")
    if fr_dirs:
        from . import flight_recorder

        return flight_recorder.load_incident(fr_dirs, 2.0 if grace is None else grace,
                                             300.0 if timeout is None else timeout)
    if not paths:
        raise ReportError("give an incident folder, rank-<r>.json files or folders, or --flight-recorder DIR")
    for path in paths:
        if not os.path.exists(path):
            raise ReportError(f"{path}: no such file or folder")
    single = _single_incident_path(paths)
    if single is not None:
        incident = load_incident(single)
        return _reanalyze(incident, grace, timeout) if args.reanalyze else incident
    from . import merge

    return merge.merged_incident(paths, 2.0 if grace is None else grace, 300.0 if timeout is None else timeout)


def _write_output(path: str, text: str) -> None:
    """Write -o FILE whole or not at all: a temp file beside it, renamed over it."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".ddpwatch-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, 0o666 & ~_umask())  # mkstemp makes it private; a report is an ordinary file
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def run_command(args, stdout=None, stderr=None) -> int:
    """`ddpwatch report`: 0 with the rendering on stdout (or in -o FILE), 2 with one error line on stderr."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    try:
        incident = build_incident(args)
        text = render_format(incident, args.format)
        if getattr(args, "output", None):
            _write_output(args.output, text)
            print(f"ddpwatch report: wrote {args.output}", file=stderr)
        else:
            stdout.write(text)
    except (OSError, S.FormatError, ReportError) as exc:  # merge and Flight Recorder errors are FormatErrors
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"ddpwatch report: {message}", file=stderr)
        return 2
    return 0


def refresh_incident(folder: str, incident: dict) -> None:
    """Rewrite an incident folder's files in place with later evidence (native stacks); each file replaced atomically."""
    staging = tempfile.mkdtemp(prefix=".refresh-", dir=folder)
    try:
        _fill(staging, incident)
        for name in os.listdir(staging):
            os.replace(os.path.join(staging, name), os.path.join(folder, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
