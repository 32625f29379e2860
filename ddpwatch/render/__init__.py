"""What every renderer of an incident shares: rank lists, stacks, ddpwatch's frames folded."""

from __future__ import annotations

from ..frames import OWN_FRAME_FILE
from .wording import rank_list

# Caps that keep the text a screen or two at any scale; report.json always has everything.
MAX_STACK_LINES = 16
RANKS_TEXT_BUDGET = 32
STACK_INDENT_USER, STACK_INDENT_INTERNAL = "  > ", "    "


# ---------------------------------------------------------------- small text helpers


def seconds_text(seconds: float) -> str:
    """'3 s', and under a second '0.6 s': a deadlock is proven at grace (0.5 s), and '0 s' would say no wait at all."""
    return f"{seconds:.1f} s" if seconds < 0.95 else f"{seconds:.0f} s"


def short_rank_list(ranks) -> str:
    """rank_list, shortened past RANKS_TEXT_BUDGET characters: 'ranks 0,2,4,6,...,30 (16 ranks)'."""
    full = rank_list(ranks)
    if len(full) <= RANKS_TEXT_BUDGET:
        return full
    parts = full[len("ranks ") :].split(",")
    head: list = []
    for part in parts[:-1]:
        if len(",".join(head + [part])) > RANKS_TEXT_BUDGET // 2:
            break
        head.append(part)
    return f"ranks {','.join(head)},...,{parts[-1]} ({len(set(ranks))} ranks)"


def _states(incident: dict) -> list:
    return list(incident.get("ranks") or ())


# ---------------------------------------------------------------- sections


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
        lines = (
            lines[:2]
            + [f"{STACK_INDENT_INTERNAL}... {len(lines) - MAX_STACK_LINES + 1} more lines"]
            + lines[-(MAX_STACK_LINES - 3) :]
        )
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
