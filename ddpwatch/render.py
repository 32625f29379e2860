"""Renders an incident document (plain data) as text for people and JSON for programs; no torch here."""

from __future__ import annotations

import json
import textwrap

from . import snapshot as S
from .analysis import positions, rank_list

WIDTH = 80


def _wrap(text: str, indent: str = "") -> list:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent) or [indent]


def _verdict_lines(incident: dict) -> list:
    findings = incident.get("findings") or []
    if not findings:
        trigger = incident.get("trigger", "dump")
        return _wrap(f"No hang proven ({trigger}); the state of every rank follows.")
    lines = []
    for finding in findings:
        lines.append(f"[{finding['kind']}] culprit: {rank_list(finding['ranks'])}"
                     + (f" at {S.short_site(finding['location'])}" if finding.get("location") else ""))
        lines.extend(_wrap(finding["summary"], "  "))
        lines.extend(_wrap("Fix: " + finding["fix"], "  "))
        lines.append("")
    return lines


def _positions_lines(incident: dict) -> list:
    states = {state["rank"]: state for state in incident.get("ranks") or ()}
    lines = ["Where each rank stands:"]
    for group in positions(states, incident.get("grace", 0.0)):
        wait = f" ({'waiting' if group['state'] == 'waiting' else 'for'} {group['wait_s']:.0f} s)"
        lines.extend(_wrap(f"{rank_list(group['ranks'])}: {group['where']}{wait}", "  "))
    missing = incident.get("missing_ranks") or []
    if missing:
        lines.append(f"  {rank_list(missing)}: no state received")
    return lines


def _mismatch_lines(incident: dict) -> list:
    lines = []
    for finding in incident.get("findings") or ():
        rows = finding.get("evidence", {}).get("mismatched")
        if not rows:
            continue
        lines.append("Mismatched collectives, side by side:")
        for row in rows:
            shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in row.get("shapes") or ()) or "-"
            lines.append(f"  {rank_list(row['ranks'])}: group {row['group']} seq {row['seq']}: {row['op']}"
                         f" [{row.get('api')}] shapes {shapes}")
            lines.extend(_wrap(row["description"], "      "))
    return lines


def _stack_lines(incident: dict) -> list:
    """Stacks per group of ranks with identical main-thread stacks, user frames only plus the innermost frames."""
    groups: dict = {}
    for state in incident.get("ranks") or ():
        main = next((s for s in state.get("stacks") or () if s.get("main")), None)
        if main is None:
            continue
        key = tuple((f["file"], f["line"], f["function"]) for f in main["frames"])
        groups.setdefault(key, ([], main))[0].append(state["rank"])
    lines = []
    for ranks, main in sorted(groups.values(), key=lambda g: g[0][0]):
        lines.append(f"Main-thread stack of {rank_list(ranks)} (most recent call last):")
        frames = main["frames"]
        for index, frame in enumerate(frames):
            innermost = index >= len(frames) - 3
            if frame.get("internal") and not innermost:
                continue
            mark = "  " if frame.get("internal") else "> "
            lines.append(f"  {mark}{frame['file']}:{frame['line']} in {frame['function']}")
    return lines


def _process_lines(incident: dict) -> list:
    lines = ["Processes:"]
    for state in incident.get("ranks") or ():
        lines.append(f"  rank {state['rank']}: pid {state.get('pid')} on {state.get('host')}, "
                     f"{state.get('ops_recorded', 0)} collective events, idle {state.get('idle_s', 0):.1f} s")
    return lines


def render_text(incident: dict) -> str:
    header = (f"ddpwatch report {incident.get('run_id', '')}: {incident.get('world_size')} ranks, "
              f"trigger {incident.get('trigger')}, written by rank {incident.get('written_by')}")
    sections = [["=" * min(WIDTH, len(header)), header, "=" * min(WIDTH, len(header))],
                _verdict_lines(incident), _positions_lines(incident), _mismatch_lines(incident),
                _stack_lines(incident), _process_lines(incident)]
    if incident.get("report_dir"):
        sections.append([f"Report files: {incident['report_dir']}"])
    return "\n".join("\n".join(section) + "\n" for section in sections if section)


def render_json(incident: dict) -> str:
    return json.dumps(incident, indent=1, default=repr) + "\n"
