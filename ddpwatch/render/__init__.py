"""Renders an incident document (plain data) as text for people and JSON for programs; no torch here."""

from __future__ import annotations

import json
import re
import textwrap

from ..format import build as S
from ..analysis import positions, rank_list

WIDTH = 80
# Up to this many ranks, the process facts get one line per rank; above it they are grouped.
PER_RANK_PROCESS_LINES = 8
# Caps that keep the text a screen or two at any scale; report.json always has everything.
MAX_POSITION_GROUPS = 12
MAX_STACK_GROUPS = 6
MAX_STACK_LINES = 16
MAX_VALUE_GROUPS = 4
RANKS_TEXT_BUDGET = 32
MAX_EXPANDED_RANKS = 2**20  # a rank run in prose longer than this is no job's: left as written
STACK_INDENT_USER, STACK_INDENT_INTERNAL = "  > ", "    "
# ddpwatch's own frames, told from the path alone so that a report renders the same on any machine: a file in the
# package or one folder below it (not the bundled examples, which play the user's part), the start-up hook, and the
# generated per-collective wrappers "<ddpwatch hot path: barrier>". At most one folder deep: torch in a virtualenv
# inside a checkout named ddpwatch (ddpwatch/.venv/lib/.../torch/...) stays torch. Also read by report.html's script.
OWN_FRAME_FILE = re.compile(r"(^|[/\\])ddpwatch[/\\]((?!examples[/\\])[^/\\]+[/\\])?[^/\\]+\.py$"
                            r"|(^|[/\\])_ddpwatch_startup\.py$|^<ddpwatch ")
SOURCES = {"rank_files": "rank files", "flight_recorder": "Flight Recorder dumps"}


# ---------------------------------------------------------------- text from outside, made safe to show

# What a terminal would act on, or what makes text read other than it is stored: C0 controls (ESC starts window-title,
# clipboard (OSC 52) and clear-screen sequences; CR lets a line be overwritten by a fake one), DEL, C1 controls (0x9b
# alone is a CSI to many terminals), bidi marks, embeddings, overrides and isolates ("Trojan Source"), line and
# paragraph separators, and lone surrogates (no encoder writes one; os.fsdecode makes them of undecodable bytes).
_BEYOND_C0 = "\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x08\x0a-\x1f{_BEYOND_C0}]")  # tab (0x09) stays: it moves the cursor, nothing more
_UNSAFE_BUT_NEWLINE = re.compile(f"[\x00-\x08\x0b-\x1f{_BEYOND_C0}]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(match) -> str:
    char = match.group(0)
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for an undecodable byte: show the byte, as git does
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def visible(text, keep_newlines: bool = False) -> str:
    """Text from outside (a rank, a file, the store) safe to print or write: every character a terminal would act
    on, and every lone surrogate, written out as an escape (ESC -> `\\x1b`, CR -> `\\r`), as git quotes a path.
    Tabs stay; newlines stay only with keep_newlines (a multi-line block); the result always encodes to UTF-8."""
    pattern = _UNSAFE_BUT_NEWLINE if keep_newlines else _UNSAFE
    return pattern.sub(_escape, str(text))


# ---------------------------------------------------------------- small text helpers

def seconds_text(seconds: float) -> str:
    """'3 s', and under a second '0.6 s': a deadlock is proven at grace (0.5 s), and '0 s' would say no wait at all."""
    return f"{seconds:.1f} s" if seconds < 0.95 else f"{seconds:.0f} s"


def short_rank_list(ranks) -> str:
    """rank_list, shortened past RANKS_TEXT_BUDGET characters: 'ranks 0,2,4,6,...,30 (16 ranks)'."""
    full = rank_list(ranks)
    if len(full) <= RANKS_TEXT_BUDGET:
        return full
    parts = full[len("ranks "):].split(",")
    head = []
    for part in parts[:-1]:
        if len(",".join(head + [part])) > RANKS_TEXT_BUDGET // 2:
            break
        head.append(part)
    return f"ranks {','.join(head)},...,{parts[-1]} ({len(set(ranks))} ranks)"


_RANK_RUN = re.compile(r"\b([Rr])anks ((?:\d+(?:-\d+)?,)+\d+(?:-\d+)?)")


def _expand(run: str) -> list:
    ranks = []
    for part in run.split(","):
        low, _, high = part.partition("-")
        ranks.extend(range(int(low), int(high or low) + 1))
    return ranks


def _run_size(run: str) -> int:
    return sum(int(high or low) - int(low) + 1 for low, _, high in (part.partition("-") for part in run.split(",")))


def shorten_rank_runs(text: str) -> str:
    """Shorten long rank lists inside prose (the analysis writes them in full; report.json keeps them so)."""
    def shorter(match):
        if len(match.group(0)) <= RANKS_TEXT_BUDGET or not 0 < _run_size(match.group(2)) <= MAX_EXPANDED_RANKS:
            return match.group(0)  # short already; or not a list of real ranks (0-99999999999 in a crafted file)
        short = short_rank_list(_expand(match.group(2)))
        return match.group(1) + short[1:]
    return _RANK_RUN.sub(shorter, text)


def _wrap(text: str, indent: str = "", subsequent: str | None = None) -> list:
    sub = indent if subsequent is None else subsequent
    # visible() first: textwrap would turn a CR or newline from outside into a space, hiding that it was there.
    lines = textwrap.wrap(visible(shorten_rank_runs(text)), WIDTH, initial_indent=indent, subsequent_indent=sub,
                          break_on_hyphens=False)
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


def _states(incident: dict) -> list:
    return list(incident.get("ranks") or ())


# ---------------------------------------------------------------- sections

def _header_lines(incident: dict) -> list:
    writer = incident.get("written_by")
    source = (incident.get("source") or {}).get("kind")
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
    lines = []
    for finding in findings:
        if lines:
            lines.append("")
        where = f" at {S.short_site(finding['location'])}" if finding.get("location") else ""
        lines.extend(_wrap(f"[{finding['kind']}] culprit: {rank_list(finding['ranks'])}{where}", "", "  "))
        lines.extend(_wrap(finding["summary"], "  "))
        lines.extend(_wrap("Fix: " + finding["fix"], "  "))
    return lines


def _positions_lines(incident: dict) -> list:
    states = {state["rank"]: state for state in _states(incident)}
    lines = ["Where each rank stands:"]
    groups = positions(states, incident.get("grace", 0.0))
    for group in groups[:MAX_POSITION_GROUPS]:
        wait = f" ({'waiting' if group['state'] == 'waiting' else 'for'} {seconds_text(group['wait_s'])})"
        lines.extend(_wrap(f"{rank_list(group['ranks'])}: {group['where']}{wait}", "  "))
    rest = groups[MAX_POSITION_GROUPS:]
    if rest:
        ranks = [r for group in rest for r in group["ranks"]]
        lines.extend(_wrap(f"... {len(rest)} more places ({short_rank_list(ranks)}); see report.json", "  "))
    missing = incident.get("missing_ranks") or []
    if missing:
        lines.extend(_wrap(f"{rank_list(missing)}: no state received", "  "))
    return lines


def _shapes_text(row: dict) -> str:
    return ", ".join("x".join(map(str, s)) or "scalar" for s in row.get("shapes") or ()) or "-"


def _mismatch_lines(incident: dict) -> list:
    lines = []
    for finding in incident.get("findings") or ():
        rows = (finding.get("evidence") or {}).get("mismatched")
        if not rows:
            continue
        if not lines:
            lines.append("Mismatched collectives, side by side:")
        for row in rows:
            lines.extend(_wrap(f"{rank_list(row['ranks'])}: group {row['group']} seq {row['seq']}: {row['op']}"
                               f" [{row.get('api')}] shapes {_shapes_text(row)}", "  ", "      "))
            if row.get("description"):
                lines.extend(_wrap(row["description"], "      "))
    return lines


def _main_stack(state: dict) -> dict | None:
    return next((s for s in state.get("stacks") or () if s.get("main")), None)


def _frame_line(frame: dict) -> str:
    # Never wrapped: a path cut in two can no longer be opened or clicked.
    mark = STACK_INDENT_INTERNAL if frame.get("internal") else STACK_INDENT_USER
    return f"{mark}{frame['file']}:{frame['line']} in {frame['function']}"


def is_own_frame(frame: dict) -> bool:
    """A frame of ddpwatch itself (its package, not the bundled examples; its generated hot-path wrappers)."""
    return bool(frame.get("internal")) and bool(OWN_FRAME_FILE.search(str(frame.get("file") or "")))


def own_frame_runs(frames: list) -> list:
    """The frames with each run of ddpwatch's own frames replaced by its length (an int): what people are shown."""
    items: list = []
    for frame in frames:
        if not is_own_frame(frame):
            items.append(frame)
        elif items and isinstance(items[-1], int):
            items[-1] += 1
        else:
            items.append(1)
    return items


def folded_frames_text(count: int, what: str = "ddpwatch") -> str:
    """'... 3 ddpwatch frames': the one line that stands for frames left out."""
    return f"... {count} {what} frame{'s' if count > 1 else ''}"


def _folded_line(hidden: int, own: int) -> str:
    what = "ddpwatch" if own == hidden else "library" if not own else "library and ddpwatch"
    return STACK_INDENT_INTERNAL + folded_frames_text(hidden, what)


def stack_lines_shown(frames: list) -> list:
    """Every user frame plus the three innermost others (where it blocks); ddpwatch's own frames never (they are the
    watcher, not the program), and runs of frames left out say so in place."""
    own = {index for index, frame in enumerate(frames) if is_own_frame(frame)}
    innermost = set([index for index in range(len(frames)) if index not in own][-3:])
    lines, hidden, hidden_own = [], 0, 0
    for index, frame in enumerate(frames):
        if frame.get("internal") and index not in innermost:  # ddpwatch's own are internal, never innermost
            hidden += 1
            hidden_own += index in own
            continue
        if hidden:
            lines.append(_folded_line(hidden, hidden_own))
            hidden = hidden_own = 0
        lines.append(_frame_line(frame))
    if hidden:
        lines.append(_folded_line(hidden, hidden_own))
    if len(lines) > MAX_STACK_LINES:  # deep user recursion: keep the outermost two and the innermost frames
        lines = lines[:2] + [f"{STACK_INDENT_INTERNAL}... {len(lines) - MAX_STACK_LINES + 1} more lines"] \
            + lines[-(MAX_STACK_LINES - 3):]
    return lines


def stack_groups(incident: dict) -> tuple:
    """([(ranks, main-thread stack)] for ranks with identical main-thread stacks, [ranks without a stack])."""
    groups: dict = {}
    without = []
    for state in _states(incident):
        main = _main_stack(state)
        if main is None:
            without.append(state["rank"])
            continue
        key = tuple((f.get("file"), f.get("line"), f.get("function")) for f in main.get("frames") or ())
        groups.setdefault(key, ([], main))[0].append(state["rank"])
    ordered = sorted(groups.values(), key=lambda g: (-len(g[0]), g[0][0]))
    return ordered, without


def _stack_lines(incident: dict) -> list:
    groups, without = stack_groups(incident)
    lines = []
    for ranks, main in sorted(groups[:MAX_STACK_GROUPS], key=lambda g: g[0][0]):
        lines.extend(_wrap(f"Main-thread stack of {rank_list(ranks)} (most recent call last):", "", "  "))
        lines.extend(stack_lines_shown(main.get("frames") or []))
    rest = groups[MAX_STACK_GROUPS:]
    if rest:
        ranks = [r for group in rest for r in group[0]]
        lines.extend(_wrap(f"... {len(rest)} more distinct stacks ({short_rank_list(ranks)}); see report.json", "  "))
    if without and groups:
        lines.extend(_wrap(f"No stack from {rank_list(without)}."))
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
    where = f"pid {state.get('pid') or '?'} on {state.get('host') or '?'}, " \
        if state.get("pid") is not None or state.get("host") is not None else ""
    text = (f"rank {state['rank']}: {where}"
            f"{state.get('ops_recorded', 0)} collective events, idle {state.get('idle_s') or 0:.1f} s"
            + (" (exited)" if state.get("status") == S.EXITED else "") + _os_facts(state.get("process")))
    return _wrap(text, "  ", "    ")


def _grouped_process_lines(states: list) -> list:
    by_host = _group_by_value({s["rank"]: s.get("host") or "?" for s in states})
    pids = sorted(s["pid"] for s in states if isinstance(s.get("pid"), int))
    pid_text = f", pids {pids[0]}-{pids[-1]}" if pids else ""
    hosts = ", ".join(f"{host} ({short_rank_list(ranks)})" for host, ranks in by_host[:MAX_VALUE_GROUPS])
    if len(by_host) > MAX_VALUE_GROUPS:
        hosts += f", ... {len(by_host) - MAX_VALUE_GROUPS} more hosts"
    lines = _wrap(f"{len(states)} processes on {len(by_host)} host{'s' if len(by_host) > 1 else ''}{pid_text}:"
                  f" {hosts}", "  ")
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
            lines += _wrap("; ".join(([f"memory {min(rss):.0f}-{max(rss):.0f} MB"] if rss else [])
                                     + ([f"CPU {min(cpu):.0f}-{max(cpu):.0f}%"] if cpu else [])), "  ")
    exited = [s["rank"] for s in states if s.get("status") == S.EXITED]
    if exited:
        lines += _wrap(f"exited: {rank_list(exited)}", "  ")
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
    bars = {s["rank"]: "; ".join(_bar_text(dict(b, since_update_s=round(b.get("since_update_s") or 0)))
                                 for b in s.get("progress_bars") or ()) for s in states if s.get("progress_bars")}
    if bars:
        lines.extend(_wrap("progress bars: " + _value_groups_text(bars, str, len(states)), "  "))
    return ["Progress:"] + lines if lines else []


def render_text(incident: dict) -> str:
    """report.txt: verdict, where ranks stand, mismatched calls, stacks per group, process and progress facts."""
    sections = [_header_lines(incident), _verdict_lines(incident), _positions_lines(incident),
                _mismatch_lines(incident), _stack_lines(incident), _process_lines(incident),
                _progress_lines(incident)]
    if incident.get("report_dir"):
        sections.append([f"Report files: {incident['report_dir']}"])
    # The output boundary: every line is made visible() whole, so no rank's or file's text reaches a terminal raw,
    # and a newline inside one (a crafted path) shows as \n instead of starting a fake line of its own.
    return "\n".join("\n".join(map(visible, section)) + "\n" for section in sections if section)


# ---------------------------------------------------------------- JSON

def json_default(value):
    """For values JSON cannot hold: a tensor-like object becomes its shape and dtype, never its contents."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} shape={list(value.shape)} dtype={value.dtype}>"
    if isinstance(value, (set, frozenset)):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def render_json(incident: dict) -> str:
    return json.dumps(incident, indent=1, default=json_default) + "\n"
