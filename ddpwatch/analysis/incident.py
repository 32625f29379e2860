"""The one incident builder: the watchdog, merged rank files, Flight Recorder dumps and --reanalyze all call build()."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from .. import analysis
from ..config import DEFAULTS
from ..format.version import FORMAT_VERSION
from . import conditions, confirm

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import Finding, Incident, IncidentSource, RankState

# The values an incident written without them (older files) was analysed with: the configuration's defaults.
DEFAULT_GRACE, DEFAULT_TIMEOUT = DEFAULTS["grace"], DEFAULTS["timeout"]


def build(
    states: dict[int, RankState],
    world_size: int,
    grace: float,
    timeout: float,
    *,
    silent: dict | None = None,
    trigger: str | None = None,
    findings: list | None = None,
    run_id: str | None = None,
    written_by: int | None = None,
    created_at: float | None = None,
    source: IncidentSource | None = None,
    missing_ranks: list | None = None,
    rank_conditions: dict | None = None,
) -> Incident:
    """An incident document from rank states, analysed here unless `findings` are given (a dump has none).

    `silent`: the watchdog's measurement of ranks whose heartbeat stopped ({rank: {"silent_s", "process", ...}}),
    kept in the incident so that analysing it again gives the same dead/unresponsive findings. `rank_conditions`:
    the rank conditions over the ranks' stacks, read from the sources when the incident was taken
    (static.rankcond.capture_rank_conditions), kept for the same reason (and the analysis reads no file). The
    trigger is the analysis' own verdict (deadlock, timeout, silent_rank), or `trigger` where the caller knows better
    (a dump).
    """
    silent = {int(rank): dict(view) for rank, view in (silent or {}).items()}
    if findings is None:
        assessment = analysis.assess(states, world_size, grace, timeout, _with_last_states(silent, states))
        findings, verdict = assessment.findings, assessment.verdict
    else:
        verdict = None
    try:
        conditions.add_rank_conditions(findings, states, rank_conditions)
    except Exception:  # a hint from captured data that may be odd: never a reason to lose the report
        pass
    created = created_at or max((s.get("published_at") or 0.0 for s in states.values()), default=0.0) or time.time()
    kind = source.get("kind", "") if source else ""
    doc: Incident = {
        "format_version": FORMAT_VERSION,
        "run_id": run_id
        or time.strftime("%Y%m%d-%H%M%S", time.localtime(created)) + (f"-{kind.replace('_', '-')}" if kind else ""),
        "world_size": world_size,
        "created_at": created,
        "trigger": trigger or verdict or (analysis.DUMP if not findings else analysis.DEADLOCK),
        "written_by": written_by,
        "grace": grace,
        "timeout": timeout,
        "ranks": [states[r] for r in sorted(states)],
        "missing_ranks": sorted(missing_ranks)
        if missing_ranks is not None
        else [r for r in range(world_size) if r not in states],
        "silent": {str(rank): _without_last_state(view) for rank, view in sorted(silent.items())},
        # passes.finding()'s data: the summary and fix types.Finding adds are render/wording.py's, added when the
        # incident is worded (by the watchdog before it writes the incident, by the renderers before they show it)
        "findings": cast("list[Finding]", findings),
    }
    if rank_conditions:
        doc["rank_conditions"] = rank_conditions
    if source:
        doc["source"] = source
    return doc


def reanalyze(incident: Incident, grace: float | None = None, timeout: float | None = None) -> Incident:
    """The same incident with its findings and trigger computed again from its saved states (and silent ranks)."""
    states = {state["rank"]: state for state in incident.get("ranks") or ()}
    grace = incident.get("grace", DEFAULT_GRACE) if grace is None else grace
    timeout = incident.get("timeout", DEFAULT_TIMEOUT) if timeout is None else timeout
    silent = {int(rank): view for rank, view in (incident.get("silent") or {}).items()}
    dump = incident.get("trigger") == analysis.DUMP
    again = build(
        states,
        incident["world_size"],
        grace,
        timeout,
        silent=silent,
        run_id=incident.get("run_id"),
        written_by=incident.get("written_by"),
        created_at=incident.get("created_at"),
        source=incident.get("source"),
        missing_ranks=incident.get("missing_ranks"),
        rank_conditions=incident.get("rank_conditions"),
    )
    if dump and not again["findings"]:
        again["trigger"] = analysis.DUMP  # asked for by hand (SIGUSR1), and still nothing to find
    if any("confirmed" in (f.get("basis") or {}) for f in incident.get("findings") or ()):
        # written live, each finding checked against the ranks' own answers (confirm.py): say it again so
        again["findings"] = confirm.reread(again["findings"], states, silent, grace)
    for key, value in incident.items():
        # What only the live writer knew (report_dir, notes) stays: any key, which a TypedDict cannot name.
        again.setdefault(key, value)  # type: ignore[misc]
    return again


def _with_last_states(silent: dict, states: dict) -> dict:
    """The silent views as analysis reads them: each with the rank's last state, which the incident keeps in ranks."""
    return {rank: dict(view, last_state=view.get("last_state") or states.get(rank)) for rank, view in silent.items()}


def _without_last_state(view: dict) -> dict:
    return {key: value for key, value in view.items() if key != "last_state"}
