"""`ddpwatch report`: the incident to render, from a saved report, merged rank files or Flight Recorder dumps."""

from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING

from .. import atomic, config, frames
from ..analysis import incident as incident_module
from ..format import documents
from ..format.version import FormatError
from ..render import report
from ..terminal import visible
from ..static import rankcond
from . import flight_recorder, merge

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import Incident


class ReportError(Exception):
    """A problem with the command's input, said in one line."""


def _single_incident(paths: list) -> Incident | None:
    """The incident to re-render when the one path given is an incident folder or a report.json file."""
    if len(paths) != 1:
        return None
    path = paths[0]
    if os.path.isdir(path):
        return documents.load_incident(path) if os.path.isfile(os.path.join(path, documents.REPORT_JSON)) else None
    return documents.as_incident(documents.load_document(path))


def _or_defaults(grace, timeout) -> tuple[float, float]:
    """--grace / --timeout as given, else the configuration's defaults."""
    return (
        incident_module.DEFAULT_GRACE if grace is None else grace,
        incident_module.DEFAULT_TIMEOUT if timeout is None else timeout,
    )


def _configured_packages() -> frames.Packages:
    """user_packages / library_packages from the configuration (files here, DDPWATCH_* variables): a Flight Recorder
    dump holds raw stacks, and the user's line in them is found as the live run would have found it."""
    try:
        return frames.packages(*config.load_packages())
    except config.ConfigError as exc:
        raise ReportError(str(exc)) from None


def build_incident(args) -> Incident:
    """The incident the command renders: a saved one, merged rank files, or Flight Recorder dumps."""
    paths = list(args.path or [])
    fr_dirs = list(getattr(args, "flight_recorder", None) or [])
    grace, timeout = getattr(args, "grace", None), getattr(args, "timeout", None)
    for option, value in (("--grace", grace), ("--timeout", timeout)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ReportError(f"{option} {value}: give a number of seconds, 0 or more")
    if fr_dirs and paths:
        raise ReportError("give either incident/rank-file paths or --flight-recorder folders, not both")
    if fr_dirs:
        return flight_recorder.load_incident(fr_dirs, *_or_defaults(grace, timeout), _configured_packages())
    if not paths:
        raise ReportError("give an incident folder, rank-<r>.json files or folders, or --flight-recorder DIR")
    for path in paths:
        if not os.path.exists(path):
            raise ReportError(f"{path}: no such file or folder")
    incident = _single_incident(paths)
    if incident is not None:
        if not args.reanalyze:
            return incident
        return incident_module.reanalyze(with_rank_conditions(incident), grace, timeout)
    return merge.merged_incident(paths, *_or_defaults(grace, timeout))


def _write(stream, text: str) -> None:
    """Write to a terminal or pipe whatever its encoding (PYTHONIOENCODING=ascii, LANG=C): what it cannot encode
    (a lone surrogate, an accent under ascii) goes out as its backslash escape instead of a UnicodeEncodeError."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))


def run_command(args, stdout=None, stderr=None) -> int:
    """`ddpwatch report`: 0 with the rendering on stdout (or in -o FILE), 2 with one error line on stderr."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    try:
        incident = build_incident(args)
        text = report.render_format(incident, args.format)
        if getattr(args, "output", None):
            atomic.write_path(args.output, documents.encoded(text))  # whole or not at all, an ordinary file
            _write(stderr, f"ddpwatch report: wrote {visible(args.output)}\n")
        else:
            _write(stdout, text)
    except (OSError, FormatError, ReportError) as exc:  # merge and Flight Recorder errors are FormatErrors
        # Its first line, split at newlines only: a CR or ESC in a crafted path inside it is shown, not obeyed.
        message = visible(str(exc).split("\n")[0]) if str(exc) else type(exc).__name__
        _write(stderr, f"ddpwatch report: {message}\n")
        return 2
    return 0


def with_rank_conditions(incident: Incident) -> Incident:
    """An incident written before incidents kept their rank conditions (no `rank_conditions`), with them read now
    from the sources its stacks name, where those still are: reanalysing it words its findings as it did then. The
    analysis reads only the incident; this loader is the one place an old document's sources are read."""
    if "rank_conditions" in incident:
        return incident
    states = {state["rank"]: state for state in incident.get("ranks") or ()}
    captured = rankcond.capture_rank_conditions(states)
    return {**incident, "rank_conditions": captured} if captured else incident
