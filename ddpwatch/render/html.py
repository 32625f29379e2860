"""Renders an incident as one self-contained HTML page (inline CSS, JS, SVG and the incident JSON); no torch."""

from __future__ import annotations

import html
import json
import re
import time

from .. import render
from ..format import build
from ..format.documents import json_default
from ..frames import OWN_FRAME_FILE
from ..terminal import visible
from .positions import groups_by_position
from .wording import describe_op, rank_list, summary_for_people, worded_incident

# Above this many ranks, ranks whose timelines look the same share one lane.
MAX_RANK_LANES = 64
MAX_LANES = 64
MAX_COLUMNS = 40
LABEL_W, COL_W, BOX_W, LANE_H, BOX_H, TOP = 190, 96, 88, 38, 30, 34
TIME_W = 900
NOW_KEY = ("now",)


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


# ---------------------------------------------------------------- the model behind the picture


def _key(record: dict) -> tuple:
    """A record's place in the sequence view: its process group and position (point-to-point kept apart)."""
    return (str(record.get("group")), "p2p" if record.get("p2p") else "", record.get("seq"))


def _records(state: dict) -> list:
    return [r for r in list(state.get("recent") or ()) + list(state.get("inflight") or ()) if r.get("seq") is not None]


def _roles(incident: dict) -> tuple:
    """({(rank, key): 'culprit'|'waiting'}, [first diverging key per finding]) from the findings' evidence."""
    roles, divergence = {}, []
    for finding in incident.get("findings") or ():
        culprits = set(finding.get("ranks") or ())
        rows = (finding.get("evidence") or {}).get("mismatched") or []
        for row in rows:
            key = (str(row.get("group")), "", row.get("seq"))
            for rank in row.get("ranks") or ():
                roles[(rank, key)] = "culprit" if rank in culprits else "waiting"
        if rows:
            first = min(rows, key=lambda row: row.get("seq") if row.get("seq") is not None else 0)
            divergence.append((str(first.get("group")), "", first.get("seq")))
    return roles, divergence


def _busy_ranks(incident: dict, states: dict) -> dict:
    """rank -> 'busy outside collectives at x.py:40 (400 s)' for ranks not waiting in a collective."""
    busy = {}
    for group in groups_by_position(states, incident.get("grace", 0.0)):
        if group["state"] == "busy":
            for rank in group["ranks"]:
                busy[rank] = f"{group['where']} (for {render.seconds_text(group['wait_s'])})"
    return busy


def _columns(by_rank: dict, divergence: list, has_busy: bool) -> tuple:
    """(the keys shown, left to right by first start; how many older keys were left out)."""
    first_start: dict = {}
    for records in by_rank.values():
        for record in records:
            key = _key(record)
            start = record.get("start") or 0.0
            first_start[key] = min(first_start.get(key, start), start)
    keys = sorted(first_start, key=lambda k: (first_start[k], k[0], k[1], k[2]))
    keep = keys[-MAX_COLUMNS:]
    for key in divergence:
        if key in first_start and key not in keep:
            keep = [key] + keep[1:]  # the divergence is the point of the picture: never cut it off
    keep = [k for k in keys if k in keep]
    if has_busy:
        keep.append(NOW_KEY)
    return keep, len(keys) - len([k for k in keep if k != NOW_KEY])


def _cell(record: dict, role: str | None) -> tuple:
    return (record.get("op"), record.get("api"), record.get("state"), (record.get("region") or {}).get("kind"), role)


def _lanes(states: dict, by_rank: dict, roles: dict, busy: dict, columns: list) -> list:
    """[ranks] per lane: one rank per lane, or at scale the ranks whose shown cells are all alike."""
    ranks = sorted(states)
    if len(ranks) <= MAX_RANK_LANES:
        return [[r] for r in ranks]
    shown = set(columns)
    signatures: dict = {}
    for rank in ranks:
        cells = tuple((_key(r), _cell(r, roles.get((rank, _key(r))))) for r in by_rank[rank] if _key(r) in shown)
        signatures.setdefault((cells, rank in busy), []).append(rank)
    lanes = sorted(signatures.values(), key=lambda group: group[0])
    if len(lanes) > MAX_LANES:
        lanes = lanes[: MAX_LANES - 1] + [[r for lane in lanes[MAX_LANES - 1 :] for r in lane]]
    return lanes


def _box_class(record: dict, role: str | None) -> str:
    classes = ["op", record.get("state") or "unknown"]
    if role:
        classes += ["mismatch", role]
    if (record.get("region") or {}).get("kind") == build.DDP_FORWARD:
        classes.append("ddp")
    return " ".join(classes)


def _box_label(record: dict) -> tuple:
    region = record.get("region") or {}
    if region.get("kind") == build.DDP_FORWARD:
        return record.get("op"), "in DDP.forward"
    if region.get("kind") == build.OBJECT_COLLECTIVE:
        return record.get("op"), f"in {region.get('api')}"
    api = record.get("api")
    return record.get("op"), (api if api and api != record.get("op") else build.short_site(record.get("site")))


def _tooltip(ranks: list, record: dict) -> str:
    where = build.format_site(record.get("site"))
    state = record.get("state")
    age = f", {state} {record.get('age_s') or 0:.1f} s" if state == build.IN_FLIGHT else f", {state}"
    return (
        f"{rank_list(ranks)} - group {record.get('group')} seq {record.get('seq')}: {describe_op(record)}"
        f"{age}\ncall site: {where}"
    )


# ---------------------------------------------------------------- SVG


def _fit(text, width: float, char_w: float) -> str:
    """Cut a label to the box (monospace, so characters times width); the tooltip has it whole. A file:line
    label loses its start, not the line number."""
    text = "" if text is None else str(text)
    room = max(0, int((width - 8) / char_w))
    if len(text) <= room:
        return text
    if re.search(r":\d+$", text):
        return "\u2026" + text[-max(0, room - 1) :]
    return text[: max(0, room - 1)] + "\u2026"


def _svg_box(x: float, y: float, w: float, ranks: list, record: dict, role: str | None, index: int) -> str:
    title, sub = _box_label(record)
    text = (
        (
            f'<text x="{x + 5:.1f}" y="{y + 13}" class="l1">{_e(_fit(title, w, 6.7))}</text>'
            f'<text x="{x + 5:.1f}" y="{y + 25}" class="l2">{_e(_fit(sub, w, 5.5))}</text>'
        )
        if w >= 40
        else ""
    )
    return (
        f'<g class="{_e(_box_class(record, role))}" tabindex="0" data-rank="{_e(ranks[0])}" '
        f'data-record="{int(index)}">'
        f"<title>{_e(_tooltip(ranks, record))}</title>"
        f'<rect x="{x:.1f}" y="{y}" width="{max(w, 3):.1f}" height="{BOX_H}" rx="4"></rect>{text}</g>'
    )


def _lane_label(y: float, ranks: list, culprit: bool) -> str:
    label = render.short_rank_list(ranks)
    cls = "lane-label culprit" if culprit else "lane-label"
    return f'<text x="8" y="{y + BOX_H / 2 + 4}" class="{cls}" data-ranks="{_e(rank_list(ranks))}">{_e(label)}</text>'


def _column_label(key: tuple, many_groups: bool) -> str:
    if key == NOW_KEY:
        return "now"
    group, p2p, seq = key
    name = f"{'p2p ' if p2p else ''}seq {seq}"
    return f"g{group} {name}" if many_groups else name


def _record_indexes(states: dict) -> dict:
    """id(record) -> where it sits in the embedded JSON: recent first, then inflight (what the script looks up).

    Worked out once for all records: a search per box made a rank with many records quadratic (minutes)."""
    indexes: dict = {}
    for state in states.values():
        everything = list(state.get("recent") or ()) + list(state.get("inflight") or ())
        indexes.update((id(record), index) for index, record in enumerate(everything))
    return indexes


def _sequence_svg(model: dict) -> str:
    columns, lanes = model["columns"], model["lanes"]
    many_groups = len({k[0] for k in columns if k != NOW_KEY}) > 1
    width = LABEL_W + COL_W * max(1, len(columns)) + 10
    height = TOP + LANE_H * len(lanes) + 10
    parts = [
        f'<svg id="sequence-view" class="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="collectives by sequence position">'
    ]
    for index, key in enumerate(columns):
        x = LABEL_W + COL_W * index
        if key in model["divergence"]:
            parts.append(
                f'<rect id="divergence" class="divergence" x="{x - 3}" y="{TOP - 16}" width="{BOX_W + 6}" '
                f'height="{LANE_H * len(lanes) + 14}" rx="6"><title>first diverging position: group '
                f"{_e(key[0])} seq {_e(key[2])}</title></rect>"
            )
        parts.append(f'<text x="{x + 4}" y="{TOP - 6}" class="col-label">{_e(_column_label(key, many_groups))}</text>')
    if model["left_out"]:
        parts.append(
            f'<text x="8" y="{TOP - 6}" class="col-label">({model["left_out"]} older positions not shown)</text>'
        )
    for lane_index, ranks in enumerate(lanes):
        y = TOP + LANE_H * lane_index
        rank = ranks[0]
        parts.append(f'<g class="lane" data-ranks="{_e(rank_list(ranks))}">')
        parts.append(_lane_label(y, ranks, any(r in model["culprits"] for r in ranks)))
        by_key = {_key(r): r for r in model["by_rank"][rank]}
        for index, key in enumerate(columns):
            x = LABEL_W + COL_W * index
            if key == NOW_KEY and rank in model["busy"]:
                parts.append(
                    f'<g class="op busy{" culprit" if rank in model["culprits"] else ""}" '
                    f'data-rank="{_e(rank)}"><title>{_e(rank_list(ranks))}: {_e(model["busy"][rank])}</title>'
                    f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4"></rect>'
                    f'<text x="{x + 5}" y="{y + 13}" class="l1">busy</text>'
                    f'<text x="{x + 5}" y="{y + 25}" class="l2">outside collectives</text></g>'
                )
            elif key in by_key:
                record = by_key[key]
                parts.append(
                    _svg_box(x, y, BOX_W, ranks, record, model["roles"].get((rank, key)), model["indexes"][id(record)])
                )
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _time_range(model: dict) -> tuple:
    starts = [r["start"] for records in model["by_rank"].values() for r in records if r.get("start") is not None]
    end = model["end"]
    if not starts:
        return None, None
    t0 = min(starts)
    t1 = max(
        [end or 0.0]
        + [
            r["start"] + (r.get("duration_s") or 0.0)
            for rs in model["by_rank"].values()
            for r in rs
            if r.get("start") is not None
        ]
    )
    return t0, max(t1, t0 + 1e-3)


def _record_end(record: dict, end: float | None) -> float:
    if record.get("state") == build.IN_FLIGHT:
        return end if end is not None else record["start"] + (record.get("age_s") or 0.0)
    return record["start"] + (record.get("duration_s") or 0.0)


def _time_svg(model: dict) -> str:
    t0, t1 = _time_range(model)
    lanes = model["lanes"]
    width = LABEL_W + TIME_W + 90
    height = TOP + LANE_H * len(lanes) + 10
    parts = [
        f'<svg id="time-view" class="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="collectives over time">'
    ]
    if t0 is None:
        return parts[0] + '<text x="8" y="20">no timed records</text></svg>'
    scale = TIME_W / (t1 - t0)
    for tick in range(6):
        at = t0 + (t1 - t0) * tick / 5
        x = LABEL_W + (at - t0) * scale
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP - 12}" y2="{height}" class="tick"></line>'
            f'<text x="{x + 3:.1f}" y="{TOP - 6}" class="col-label">'
            f"{'incident' if tick == 5 else f'{at - t1:+.2f} s'}</text>"
        )
    for lane_index, ranks in enumerate(lanes):
        y = TOP + LANE_H * lane_index
        rank = ranks[0]
        parts.append(_lane_label(y, ranks, any(r in model["culprits"] for r in ranks)))
        # The ops of the mismatch last, so that nothing drawn later hides them.
        ordered = sorted(
            model["by_rank"][rank],
            key=lambda r: (model["roles"].get((rank, _key(r))) is not None, r.get("start") or 0.0),
        )
        for record in ordered:
            if record.get("start") is None:
                continue
            x = LABEL_W + (record["start"] - t0) * scale
            w = (_record_end(record, model["end"]) - record["start"]) * scale
            parts.append(
                _svg_box(x, y, w, ranks, record, model["roles"].get((rank, _key(record))), model["indexes"][id(record)])
            )
    parts.append("</svg>")
    return "".join(parts)


def build_model(incident: dict) -> dict:
    """Everything the two timeline views draw, worked out once."""
    states = {state["rank"]: state for state in incident.get("ranks") or ()}
    by_rank = {rank: sorted(_records(state), key=lambda r: r.get("start") or 0.0) for rank, state in states.items()}
    roles, divergence = _roles(incident)
    busy = _busy_ranks(incident, states)
    columns, left_out = _columns(by_rank, divergence, bool(busy))
    culprits = {r for f in incident.get("findings") or () for r in f.get("ranks") or ()}
    return {
        "states": states,
        "by_rank": by_rank,
        "roles": roles,
        "divergence": set(divergence),
        "busy": busy,
        "columns": columns,
        "left_out": left_out,
        "lanes": _lanes(states, by_rank, roles, busy, columns),
        "culprits": culprits,
        "end": incident.get("created_at"),
        "indexes": _record_indexes(states),
    }


# ---------------------------------------------------------------- the page's sections


def _verdict_html(incident: dict) -> str:
    findings = incident.get("findings") or []
    if not findings:
        return (
            f'<section id="verdict" class="verdict none"><h2>No hang proven '
            f"({_e(incident.get('trigger'))})</h2><p>The state of every rank follows.</p></section>"
        )
    parts = ['<section id="verdict" class="verdict">']
    for finding in findings:
        where = f" at {build.short_site(finding['location'])}" if finding.get("location") else ""
        parts.append(
            f'<div class="finding"><h2><span class="kind">{_e(finding["kind"])}</span> culprit: '
            f'<span class="culprit">{_e(render.short_rank_list(finding["ranks"]))}</span>{_e(where)}</h2>'
            f'<p class="summary">{_e(summary_for_people(finding, render.short_rank_list))}</p>'
            f'<p class="fix"><b>Fix:</b> {_e(finding["fix"])}</p></div>'
        )
    parts.append("</section>")
    return "".join(parts)


def _positions_html(incident: dict) -> str:
    states = {state["rank"]: state for state in incident.get("ranks") or ()}
    groups = groups_by_position(states, incident.get("grace", 0.0))
    rows = [
        f'<tr class="{_e(g["state"])}"><td>{_e(render.short_rank_list(g["ranks"]))}</td><td>{_e(g["where"])}</td>'
        f"<td>{render.seconds_text(g['wait_s'])}</td></tr>"
        for g in groups
    ]
    missing = incident.get("missing_ranks") or []
    if missing:
        rows.append(f'<tr class="missing"><td>{_e(rank_list(missing))}</td><td>no state received</td><td></td></tr>')
    return (
        '<section id="positions"><h2>Where each rank stands</h2><table><tr><th>ranks</th><th>where</th>'
        f"<th>for</th></tr>{''.join(rows)}</table></section>"
    )


def _frame_item(item) -> str:
    """One line of a stack: a frame, or (an int) a run of ddpwatch's own frames folded into one line."""
    if isinstance(item, int):
        return f'<li class="internal own">{_e(render.folded_frames_text(item))}</li>'
    return (
        f'<li class="{"internal" if item.get("internal") else "user"}">{_e(item.get("file"))}:'
        f"{_e(item.get('line'))} in {_e(item.get('function'))}</li>"
    )


def _stacks_html(incident: dict) -> str:
    groups, without = render.stack_groups(incident)
    parts = ['<section id="stacks"><h2>Main-thread stacks, per group of ranks (most recent call last)</h2>']
    for ranks, main in sorted(groups, key=lambda g: g[0][0]):
        frames = "".join(_frame_item(item) for item in render.own_frame_runs(main.get("frames") or []))
        parts.append(
            f'<details open><summary>{_e(rank_list(ranks))}</summary><ol class="frames">{frames}</ol></details>'
        )
    if without:
        parts.append(f"<p>No stack from {_e(rank_list(without))}.</p>")
    parts.append("</section>")
    return "".join(parts)


def _story_html(incident: dict) -> str:
    """The diverging calls in words, under the picture: who is the culprit, who waits, and where."""
    items = []
    for finding in incident.get("findings") or ():
        culprits = set(finding.get("ranks") or ())
        for row in (finding.get("evidence") or {}).get("mismatched") or ():
            role = "culprit" if culprits & set(row.get("ranks") or ()) else "waiting"
            items.append(
                f'<li class="{role}"><b>{_e(render.short_rank_list(row["ranks"]))}</b> ({role}): '
                f"{_e(row.get('description') or row.get('op'))} - group {_e(row.get('group'))} "
                f"seq {_e(row.get('seq'))}</li>"
            )
    return f'<ul class="story">{"".join(items)}</ul>' if items else ""


def _timeline_html(model: dict, incident: dict) -> str:
    return (
        '<section id="timeline"><h2>Timeline</h2>'
        '<p class="controls"><button type="button" data-view="sequence-view" class="on">by sequence position'
        '</button> <button type="button" data-view="time-view">by time</button> '
        '<span class="legend"><span class="sw culprit"></span>culprit, in flight '
        '<span class="sw waiting"></span>waiting, in flight <span class="sw in_flight"></span>in flight '
        '<span class="sw completed"></span>completed <span class="sw div"></span>first divergence</span></p>'
        f'<div class="scroll">{_sequence_svg(model)}<div hidden>{_time_svg(model)}</div></div>'
        f"{_story_html(incident)}"
        '<div id="details" class="details">Click a box (or focus it and press Enter) for its call site and the '
        "rank's stack.</div></section>"
    )


def _embedded_json(incident: dict) -> str:
    text = json.dumps(incident, default=json_default, separators=(",", ":"))
    # Inside <script>, "</" would end the element early: escape the characters HTML cares about.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _title(incident: dict) -> str:
    findings = incident.get("findings") or []
    if not findings:
        return f"ddpwatch report {incident.get('run_id', '')}: no hang proven"
    first = findings[0]
    where = f" at {build.short_site(first['location'])}" if first.get("location") else ""
    return f"ddpwatch: {first['kind']}, {render.short_rank_list(first['ranks'])}{where}"


def _facts(incident: dict) -> str:
    created = incident.get("created_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created)) if created else "?"
    writer = incident.get("written_by")
    by = f"written by rank {writer}" if writer is not None else "rebuilt offline"
    return (
        f"{incident.get('world_size')} ranks, trigger {incident.get('trigger')}, {by}, at {when}"
        f" (format_version {incident.get('format_version')})"
    )


def render_html(incident: dict) -> str:
    """report.html: verdict, timeline (one lane per rank or group of ranks), positions, stacks; works offline."""
    incident = worded_incident(incident)
    model = build_model(incident)
    body = "".join(
        [
            f"<header><h1>{_e('ddpwatch report ' + str(incident.get('run_id', '')))}</h1>"
            f'<p class="facts">{_e(_facts(incident))}</p></header>',
            _verdict_html(incident),
            _timeline_html(model, incident),
            _positions_html(incident),
            _stacks_html(incident),
        ]
    )
    # Escaped HTML can still hold a raw ESC or CR (shown by `cat report.html`): made visible at the page's boundary.
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{_e(_title(incident))}</title>'
        f"<style>{_CSS}</style></head><body>{body}"
        f'<script type="application/json" id="incident-data">{_embedded_json(incident)}</script>'
        f"<script>{_JS}</script></body></html>\n"
    )
    return visible(page, keep_newlines=True)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1280px;padding:16px;
color:#1d232a;background:#fafbfc}
h1{font-size:20px;margin:0}h2{font-size:16px;margin:18px 0 8px}.facts{color:#5a6470;margin:2px 0 12px}
.verdict{border-left:6px solid #c62828;background:#fff;padding:6px 14px;box-shadow:0 1px 3px #0002}
.verdict.none{border-color:#607d8b}.kind{font-family:ui-monospace,monospace;background:#fde7e7;padding:1px 6px;
border-radius:4px}.verdict .culprit{color:#c62828}.fix{background:#eef7ee;padding:6px 10px;border-radius:4px}
.scroll{overflow-x:auto;background:#fff;border:1px solid #dde2e7;border-radius:6px;padding:6px}
.timeline text{font:11px ui-monospace,monospace;fill:#1d232a}.timeline .l2{font-size:9px;fill:#4a545e}
.col-label{fill:#5a6470!important}.lane-label.culprit{fill:#c62828!important;font-weight:bold}
.op rect{fill:#cfd8dc;stroke:#90a4ae}.op.completed rect{fill:#e3eaf0;stroke:#b0bec5}
.op.in_flight rect{fill:#ffe0b2;stroke:#fb8c00;stroke-width:1.5}
.op.mismatch.waiting rect{fill:#ffecb3;stroke:#f9a825;stroke-width:2}
.op.mismatch.culprit rect,.op.busy.culprit rect{fill:#ef5350;stroke:#b71c1c;stroke-width:2.5}
.op.mismatch.culprit text,.op.busy.culprit text{fill:#fff}.op.failed rect{fill:#8e2424;stroke:#4a0f0f}
.op.busy rect{fill:#e1bee7;stroke:#8e24aa}.op{cursor:pointer}.op:focus rect,.op.sel rect{stroke:#1565c0;stroke-width:3}
.divergence{fill:#ffcdd2;fill-opacity:.55;stroke:#c62828;stroke-dasharray:4 3}.tick{stroke:#eceff1}
.controls button{border:1px solid #b0bec5;background:#fff;border-radius:4px;padding:2px 8px;cursor:pointer}
.controls button.on{background:#1d232a;color:#fff}.legend{margin-left:14px;color:#5a6470;font-size:12px}
.sw{display:inline-block;width:12px;height:12px;border-radius:3px;margin:0 4px 0 10px;vertical-align:-2px}
.sw.culprit{background:#ef5350}.sw.waiting{background:#ffecb3;border:1px solid #f9a825}
.sw.in_flight{background:#ffe0b2;border:1px solid #fb8c00}.sw.completed{background:#e3eaf0;border:1px solid #b0bec5}
.sw.div{background:#ffcdd2;border:1px dashed #c62828}
.story{margin:8px 0;padding-left:20px}.story .culprit b{color:#c62828}.story .waiting b{color:#e65100}
.details{margin-top:8px;background:#fff;border:1px solid #dde2e7;border-radius:6px;padding:8px 12px;
white-space:pre-wrap;font:12px ui-monospace,monospace}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #dde2e7;padding:3px 8px;text-align:left}
tr.waiting td:first-child{color:#e65100}tr.busy td:first-child{color:#6a1b9a}
.frames{font:12px ui-monospace,monospace;margin:4px 0;padding-left:28px}.frames .internal{color:#8a949e}
.frames .own{font-style:italic}
.frames .user{font-weight:bold}details{background:#fff;border:1px solid #dde2e7;border-radius:6px;padding:4px 10px;
margin:6px 0}summary{cursor:pointer;font-weight:bold}
"""

# Plain DOM, no libraries: switches views and shows a clicked op's call site and its rank's main stack.
_JS = r"""
(function(){
var doc=JSON.parse(document.getElementById('incident-data').textContent);
var byRank={};(doc.ranks||[]).forEach(function(s){byRank[s.rank]=s;});
var details=document.getElementById('details');
function site(w){return w?(w.file+':'+w.line+' in '+w.function+'()'):'?';}
var ownFile=new RegExp(OWN_FRAME_FILE);  // frames.OWN_FRAME_FILE: ddpwatch's own frames, folded as in report.txt
function own(f){return !!f.internal&&ownFile.test(String(f.file||''));}
function show(g){
  document.querySelectorAll('.op.sel').forEach(function(x){x.classList.remove('sel');});
  g.classList.add('sel');
  var s=byRank[g.getAttribute('data-rank')];if(!s){return;}
  var lines=[];var i=g.getAttribute('data-record');
  if(i!==null){
    var recs=(s.recent||[]).concat(s.inflight||[]);var r=recs[+i];
    lines.push('rank '+s.rank+': '+r.op+' ['+r.api+'] group '+r.group+' seq '+r.seq+', '+r.state+
      (r.state==='in_flight'?' for '+(r.age_s||0).toFixed(1)+' s':''));
    lines.push('call site: '+site(r.site));
    if(r.region){lines.push('inside '+r.region.kind+' called at '+site(r.region.site));}
    lines.push('shapes: '+JSON.stringify(r.shapes||[])+'  dtypes: '+JSON.stringify(r.dtypes||[]));
    if(r.error){lines.push('error: '+r.error);}
  } else {lines.push('rank '+s.rank+': busy outside collectives');}
  var main=(s.stacks||[]).filter(function(t){return t.main;})[0];
  if(main){
    lines.push('','main-thread stack of rank '+s.rank+' (most recent call last):');
    var run=0;
    main.frames.concat([null]).forEach(function(f){
      if(f&&own(f)){run++;return;}
      if(run){lines.push('    ... '+run+' ddpwatch frame'+(run>1?'s':''));run=0;}
      if(f){lines.push((f.internal?'    ':'  > ')+f.file+':'+f.line+' in '+f.function);}
    });
  }
  details.textContent=lines.join('\n');
}
document.querySelectorAll('.op').forEach(function(g){
  g.addEventListener('click',function(){show(g);});
  g.addEventListener('keydown',function(e){if(e.key==='Enter'){show(g);}});
});
document.querySelectorAll('button[data-view]').forEach(function(b){
  b.addEventListener('click',function(){
    document.querySelectorAll('button[data-view]').forEach(function(o){o.classList.remove('on');});
    b.classList.add('on');
    var seq=document.getElementById('sequence-view'),tim=document.getElementById('time-view');
    var wantTime=b.getAttribute('data-view')==='time-view';
    seq.style.display=wantTime?'none':'';tim.parentNode.hidden=!wantTime;
  });
});
var first=document.querySelector('.op.mismatch.culprit')||document.querySelector('.op.busy.culprit');
if(first){show(first);}
// The divergence is the point of the picture: scroll the timeline so it is in view, near the right edge.
var mark=document.getElementById('divergence');
if(mark&&mark.getBBox&&mark.closest){var pane=mark.closest('.scroll');
  if(pane){pane.scrollLeft=Math.max(0,mark.getBBox().x-pane.clientWidth*0.7);}}
document.body.setAttribute('data-ready','1');
})();
"""
# The script folds ddpwatch's own frames by report.txt's very pattern (a JSON string is a JS string literal; "<"
# escaped as in the embedded incident).
_JS = _JS.replace(
    "new RegExp(OWN_FRAME_FILE)", "new RegExp(" + json.dumps(OWN_FRAME_FILE.pattern).replace("<", "\\u003c") + ")"
)
