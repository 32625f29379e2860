"""report.txt: an incident (plain data) as text for people; no torch here."""

from __future__ import annotations

import textwrap

from .basis_words import basis_line
from ..format import build
from ..terminal import visible
from . import seconds_text, short_rank_list, stack_groups, stack_lines_shown, _states
from .positions import groups_by_position
from .wording import summary_for_people, worded_incident

WIDTH = 80
# Up to this many ranks, the process facts get one line per rank; above it they are grouped.
PER_RANK_PROCESS_LINES = 8
# Caps that keep the text a screen or two at any scale; report.json always has everything.
MAX_POSITION_GROUPS = 12
MAX_STACK_GROUPS = 6
MAX_VALUE_GROUPS = 4
SOURCES = {"rank_files": "rank files", "flight_recorder": "Flight Recorder dumps"}


def _wrap(text: str, indent: str = "", subsequent: str | None = None) -> list:
    sub = indent if subsequent is None else subsequent
    # visible() first: textwrap would turn a CR or newline from outside into a space, hiding that it was there.
    lines = textwrap.wrap(visible(text), WIDTH, initial_indent=indent, subsequent_indent=sub, break_on_hyphens=False)
    return lines or [indent.rstrip()]


def _group_by_value(values: dict) -> list:
    """{rank: value} -> [(value, ranks)], the most common value first."""
    groups: dict = {}
    for rank in sorted(values):
        groups.setdefault(values[rank], []).append(rank)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))


def _value_groups_text(values: dict, show, everyone: int | None = None) -> str:
    """'1 (ranks 1-1023), 3 (rank 0)'; '1 on every rank' when all `everyone` ranks agree; after MAX_VALUE_GROUPS
    values, a count of the rest."""
    groups = _group_by_value(values)
    if len(groups) == 1 and len(values) == (everyone or len(values)):
        return f"{show(groups[0][0])} on every rank" if len(values) > 1 else show(groups[0][0])
    shown = [f"{show(value)} ({short_rank_list(ranks)})" for value, ranks in groups[:MAX_VALUE_GROUPS]]
    if len(groups) > MAX_VALUE_GROUPS:
        shown.append(f"{len(groups) - MAX_VALUE_GROUPS} other values")
    return ", ".join(shown)


def _header_lines(incident: dict) -> list:
    writer = incident.get("written_by")
    source = (incident.get("source") or {}).get("kind") or ""  # "": no source kind (SOURCES.get gives the default)
    by = f"written by rank {writer}" if writer is not None else f"rebuilt from {SOURCES.get(source, 'saved states')}"
    title = f"ddpwatch report {incident.get('run_id', '')}"
    facts = f"{incident.get('world_size')} ranks, trigger {incident.get('trigger')}, {by}"
    rule = "=" * WIDTH
    if len(title) + 2 + len(facts) <= WIDTH:
        return [rule, f"{title}: {facts}", rule]
    return [rule] + _wrap(title) + _wrap(facts) + [rule]  # a long run id: the facts on a line of their own


def _verdict_lines(incident: dict) -> list:
    findings = incident.get("findings") or []
    if not findings:
        trigger = incident.get("trigger", "dump")
        return _wrap(f"No hang proven ({trigger}); the state of every rank follows.")
    lines: list = []
    for finding in findings:
        if lines:
            lines.append("")
        where = f" at {build.short_site(finding['location'])}" if finding.get("location") else ""
        lines.extend(_wrap(f"[{finding['kind']}] culprit: {short_rank_list(finding['ranks'])}{where}", "", "  "))
        lines.extend(_wrap(summary_for_people(finding, short_rank_list), "  "))
        lines.extend(_wrap("Fix: " + finding["fix"], "  "))
        rests_on = basis_line(finding.get("basis"))
        if rests_on:
            lines.extend(_wrap(rests_on, "  "))
    return lines


def _positions_lines(incident: dict) -> list:
    states = {state["rank"]: state for state in _states(incident)}
    lines = ["Where each rank stands:"]
    groups = groups_by_position(states, incident.get("grace", 0.0))
    for group in groups[:MAX_POSITION_GROUPS]:
        wait = f" ({'waiting' if group['state'] == 'waiting' else 'for'} {seconds_text(group['wait_s'])})"
        lines.extend(_wrap(f"{short_rank_list(group['ranks'])}: {group['where']}{wait}", "  "))
    rest = groups[MAX_POSITION_GROUPS:]
    if rest:
        ranks = [r for group in rest for r in group["ranks"]]
        lines.extend(_wrap(f"... {len(rest)} more places ({short_rank_list(ranks)}); see report.json", "  "))
    missing = incident.get("missing_ranks") or []
    if missing:
        lines.extend(_wrap(f"{short_rank_list(missing)}: no state received", "  "))
    return lines


def _shapes_text(row: dict) -> str:
    return ", ".join("x".join(map(str, s)) or "scalar" for s in row.get("shapes") or ()) or "-"


def _mismatch_lines(incident: dict) -> list:
    lines: list = []
    for finding in incident.get("findings") or ():
        rows = (finding.get("evidence") or {}).get("mismatched")
        if not rows:
            continue
        if not lines:
            lines.append("Mismatched collectives, side by side:")
        for row in rows:
            call = row["op"] if "counts" in row else f"{row['op']} [{row.get('api')}] shapes {_shapes_text(row)}"
            lines.extend(
                _wrap(f"{short_rank_list(row['ranks'])}: group {row['group']} seq {row['seq']}: {call}", "  ", "      ")
            )
            if row.get("description"):
                lines.extend(_wrap(row["description"], "      "))
    return lines


def _stack_lines(incident: dict) -> list:
    groups, without = stack_groups(incident)
    lines = []
    for ranks, main in sorted(groups[:MAX_STACK_GROUPS], key=lambda g: g[0][0]):
        lines.extend(_wrap(f"Main-thread stack of {short_rank_list(ranks)} (most recent call last):", "", "  "))
        lines.extend(stack_lines_shown(main.get("frames") or []))
    rest = groups[MAX_STACK_GROUPS:]
    if rest:
        ranks = [r for group in rest for r in group[0]]
        lines.extend(_wrap(f"... {len(rest)} more distinct stacks ({short_rank_list(ranks)}); see report.json", "  "))
    if without and groups:
        lines.extend(_wrap(f"No stack from {short_rank_list(without)}."))
    return lines


def _os_facts(process: dict | None) -> str:
    """', sleeping, 31% CPU, 317 MB' from the psutil facts a rank sends, when it sends them."""
    if not isinstance(process, dict) or not process:
        return ""
    parts = [str(process["status"])] if process.get("status") else []
    if process.get("cpu_percent") is not None:
        parts.append(f"{process['cpu_percent']:.0f}% CPU")
    if process.get("rss_mb") is not None:
        parts.append(f"{process['rss_mb']:.0f} MB")
    return ", " + ", ".join(parts) if parts else ""


def _process_line(state: dict) -> list:
    where = (
        f"pid {state.get('pid') or '?'} on {state.get('host') or '?'}, "
        if state.get("pid") is not None or state.get("host") is not None
        else ""
    )
    text = (
        f"rank {state['rank']}: {where}"
        f"{state.get('ops_recorded', 0)} collective events, idle {state.get('idle_s') or 0:.1f} s"
        + (_exit_words(state) if state.get("status") == build.EXITED else "")
        + _os_facts(state.get("process"))
    )
    return _wrap(text, "  ", "    ")


def _exit_words(state: dict) -> str:
    ended_by = state.get("signal")
    return f" (exited: ended by {ended_by})" if isinstance(ended_by, str) and ended_by else " (exited)"


def _grouped_process_lines(states: list) -> list:
    by_host = _group_by_value({s["rank"]: s.get("host") or "?" for s in states})
    pids = sorted(s["pid"] for s in states if isinstance(s.get("pid"), int))
    pid_text = f", pids {pids[0]}-{pids[-1]}" if pids else ""
    hosts = ", ".join(f"{host} ({short_rank_list(ranks)})" for host, ranks in by_host[:MAX_VALUE_GROUPS])
    if len(by_host) > MAX_VALUE_GROUPS:
        hosts += f", ... {len(by_host) - MAX_VALUE_GROUPS} more hosts"
    lines = _wrap(
        f"{len(states)} processes on {len(by_host)} host{'s' if len(by_host) > 1 else ''}{pid_text}: {hosts}", "  "
    )
    events = {s["rank"]: s.get("ops_recorded", 0) for s in states}
    lines += _wrap("collective events: " + _value_groups_text(events, str), "  ")
    idle = {s["rank"]: round(s.get("idle_s") or 0.0) for s in states}
    lines += _wrap("idle: " + _value_groups_text(idle, lambda v: f"{v} s"), "  ")
    facts = {s["rank"]: s["process"] for s in states if isinstance(s.get("process"), dict) and s["process"]}
    if facts:
        status = {r: f.get("status") or "?" for r, f in facts.items()}
        lines += _wrap("process state: " + _value_groups_text(status, str), "  ")
        rss = [f["rss_mb"] for f in facts.values() if f.get("rss_mb") is not None]
        cpu = [f["cpu_percent"] for f in facts.values() if f.get("cpu_percent") is not None]
        if rss or cpu:
            lines += _wrap(
                "; ".join(
                    ([f"memory {min(rss):.0f}-{max(rss):.0f} MB"] if rss else [])
                    + ([f"CPU {min(cpu):.0f}-{max(cpu):.0f}%"] if cpu else [])
                ),
                "  ",
            )
    exited = [s["rank"] for s in states if s.get("status") == build.EXITED]
    if exited:
        lines += _wrap(f"exited: {short_rank_list(exited)}", "  ")
    return lines


def _process_lines(incident: dict) -> list:
    states = _states(incident)
    if not states:
        return []
    if len(states) <= PER_RANK_PROCESS_LINES:
        return ["Processes:"] + [line for state in states for line in _process_line(state)]
    return ["Processes:"] + _grouped_process_lines(states)


def _bar_text(bar: dict) -> str:
    total = f"/{bar['total']}" if bar.get("total") is not None else ""
    return f"{bar.get('desc') or 'bar'} {bar.get('n')}{total}, still for {bar.get('since_update_s') or 0:.0f} s"


RECORDER_WORDS = {
    "python": "ddpwatch's wrappers (recorder=python)",
    "flight": "torch's Flight Recorder (recorder=flight)",
}


def _progress_lines(incident: dict) -> list:
    """How far each rank got: the last sequence position per process group, DDP steps, its progress bars."""
    states = _states(incident)
    per_group: dict = {}
    for state in states:
        for group, seq in (state.get("last_seq") or {}).items():
            per_group.setdefault(str(group), {})[state["rank"]] = seq
    lines = []
    for group in sorted(per_group, key=lambda g: (len(g), g)):
        lines.extend(_wrap(f"group {group}: last seq " + _value_groups_text(per_group[group], str, len(states)), "  "))
    steps = {s["rank"]: s["ddp_steps"] for s in states if s.get("ddp_steps") is not None}
    if steps:  # ranks that trained a different number of steps differ here (uneven inputs)
        lines.extend(_wrap("DDP training steps: " + _value_groups_text(steps, str, len(states)), "  "))
    # Bars grouped by description and count; how long each has stood still differs a little between ranks.
    bars = {
        s["rank"]: "; ".join(
            _bar_text(dict(b, since_update_s=round(b.get("since_update_s") or 0))) for b in s.get("progress_bars") or ()
        )
        for s in states
        if s.get("progress_bars")
    }
    if bars:
        lines.extend(_wrap("progress bars: " + _value_groups_text(bars, str, len(states)), "  "))
    recorders = {s["rank"]: RECORDER_WORDS.get(s["recorder"], s["recorder"]) for s in states if s.get("recorder")}
    if recorders:  # the sequence numbers above count what that recorder counts (torch's: C++ collectives too)
        lines.extend(_wrap("recorded by: " + _value_groups_text(recorders, str, len(states)), "  "))
    return ["Progress:"] + lines if lines else []


def render_text(incident: dict) -> str:
    """report.txt: verdict, where ranks stand, mismatched calls, stacks per group, process and progress facts."""
    incident = worded_incident(incident)
    sections = [
        _header_lines(incident),
        _verdict_lines(incident),
        _positions_lines(incident),
        _mismatch_lines(incident),
        _stack_lines(incident),
        _process_lines(incident),
        _progress_lines(incident),
    ]
    if incident.get("report_dir"):
        sections.append([f"Report files: {incident['report_dir']}"])
    # The output boundary: every line is made visible() whole, so no rank's or file's text reaches a terminal raw,
    # and a newline inside one (a crafted path) shows as \n instead of starting a fake line of its own.
    return "\n".join("\n".join(map(visible, section)) + "\n" for section in sections if section)
