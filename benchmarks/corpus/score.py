"""The corpus's scoring on plain data: a case's EXPECT, its `# LINE:` tags, the ranks' stderr and a report.json dict."""

from __future__ import annotations

import ast
import glob
import json
import os
import re

CASES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")
KINDS = {  # what ddpwatch has today, then the kinds being built next to this corpus
    "ddp_forward_on_subset",
    "collective_on_subset",
    "skipped_collective",
    "uneven_inputs",
    "shape_mismatch",
    "group_order",
    "collective_mismatch",
    "straggler",
    "collective_stuck",
    "dead_rank",
    "unresponsive_rank",
    "p2p_deadlock",
    "local_decision",
    "caught_exception",
}
FAMILIES = {"p2p", "decision", "exception", "collective", "benign"}
EXPECT_KEYS = {"source", "summary", "family", "world_size", "kind", "ranks", "line", "fix"}
OPTIONAL_KEYS = {"gloo_note"}
MARK = re.compile(r"^DDPWATCH-MARK hang-forms (\d+\.\d+)\s*$", re.MULTILINE)
TAG = re.compile(r"#\s*LINE:(\w+)")


def case_paths(only=None) -> list:
    """The case scripts, in file order; `only` keeps those whose name contains one of the given strings."""
    paths = sorted(glob.glob(os.path.join(CASES_DIR, "[0-9]*.py")), key=lambda p: int(case_name(p).split("_")[0]))
    if only:
        paths = [p for p in paths if any(part in os.path.basename(p) for part in only)]
    return paths


def case_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def load_expect(path: str) -> dict:
    """The module-level EXPECT dict, read without importing the case (no torch, no side effects)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXPECT" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{path}: no module-level EXPECT")


def tag_lines(path: str) -> dict:
    """{tag name: 1-based line number} of every `# LINE:<name>` comment in the file."""
    with open(path, encoding="utf-8") as handle:
        return {m.group(1): number for number, text in enumerate(handle, 1) for m in TAG.finditer(text)}


def is_scored(expect: dict) -> bool:
    # A thread whose hang cannot form on gloo CPU is run and shown, never counted.
    return not expect.get("gloo_note")


def last_mark(stderr_texts) -> float | None:
    """When the hang had formed: the latest of each rank's last DDPWATCH-MARK (None if no rank printed one)."""
    lasts = [float(found[-1]) for found in (MARK.findall(text or "") for text in stderr_texts) if found]
    return max(lasts) if lasts else None


def read_report(folder: str) -> dict | None:
    """The first <folder>/*/report.json (by name), or None when ddpwatch wrote no report."""
    for path in sorted(glob.glob(os.path.join(folder, "*", "report.json"))):
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    return None


def said(report: dict | None) -> dict | None:
    """What ddpwatch said, from the first finding: kind, ranks, file, line, fix."""
    if not report or not report.get("findings"):
        return None
    first = report["findings"][0]
    location = first.get("location") or {}
    return {
        "kind": first.get("kind"),
        "ranks": sorted(first.get("ranks") or []),
        "file": location.get("file"),
        "line": location.get("line"),
        "fix": first.get("fix") or "",
    }


def score(
    expect: dict, path: str, report: dict | None, exit_codes, mark: float | None, output_differs: bool = False
) -> dict:
    """One row: each check True/False, or None where it does not apply (the benign cases have no kind to match).
    `output_differs`: a correct program printed other results armed than plain (a false alarm too)."""
    got = said(report)
    row = {
        "case": case_name(path),
        "family": expect["family"],
        "expected": expect["kind"] or "none",
        "scored": is_scored(expect),
        "exit_codes": list(exit_codes),
        "said": got,
        "kind": None,
        "ranks": None,
        "line": None,
        "fix": None,
        "false_alarm": None,
        "latency": None,
    }
    if report and mark is not None and report.get("created_at") is not None:
        row["latency"] = round(report["created_at"] - mark, 2)
    if expect["kind"] is None:
        row["false_alarm"] = report is not None or any(code != 0 for code in exit_codes) or output_differs
        row["output_differs"] = output_differs
        row["kind"] = not row["false_alarm"]
        return row
    row["kind"] = bool(got) and got["kind"] == expect["kind"]
    row["ranks"] = bool(got) and got["ranks"] == sorted(expect["ranks"])
    line = tag_lines(path).get(expect["line"])
    row["line"] = bool(got) and got["line"] == line and os.path.basename(got["file"] or "") == os.path.basename(path)
    row["fix"] = bool(got) and any(word in got["fix"].lower() for word in expect["fix"])
    return row


def group_of(family: str) -> str:
    return "decision+exception" if family in ("decision", "exception") else family


def _cell(value) -> str:
    return "-" if value is None else ("ok" if value is True else "MISS" if value is False else str(value))


COLUMNS = ("case", "expected", "kind", "ranks", "line", "fix", "false alarm", "latency s")


def table(rows: list) -> str:
    """The fixed-width score table, one line per case, then the totals per family group and overall."""
    cells = [COLUMNS]
    for row in rows:
        if not row["scored"]:
            got = row["said"]["kind"] if row["said"] else "no report"
            cells.append((row["case"], "(gloo: not scored)", got, "", "", "", "", f"exit {row['exit_codes']}"))
            continue
        false_alarm = "YES" if row["false_alarm"] else ("no" if row["false_alarm"] is False else "-")
        latency = "-" if row["latency"] is None else f"{row['latency']:.2f}"
        cells.append(
            (
                row["case"],
                row["expected"],
                _cell(row["kind"]),
                _cell(row["ranks"]),
                _cell(row["line"]),
                _cell(row["fix"]),
                false_alarm,
                latency,
            )
        )
    widths = [max(len(str(line[i])) for line in cells) for i in range(len(COLUMNS))]
    text = [" ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells]
    text.insert(1, " ".join("-" * w for w in widths))
    return "\n".join(text + [""] + totals(rows))


def totals(rows: list) -> list:
    """Hits over cases where the check applies, per family group and overall; false alarms over benign cases."""
    scored = [row for row in rows if row["scored"]]
    groups = sorted(
        {group_of(row["family"]) for row in scored}, key=["p2p", "decision+exception", "collective", "benign"].index
    )
    lines = []
    for label, members in [(g, [r for r in scored if group_of(r["family"]) == g]) for g in groups] + [("all", scored)]:
        parts = []
        for column in ("kind", "ranks", "line", "fix"):
            applies = [r[column] for r in members if r[column] is not None]
            if applies:
                parts.append(f"{column} {sum(applies)}/{len(applies)}")
        benign = [r for r in members if r["false_alarm"] is not None]
        if benign:
            parts.append(f"false alarms {sum(r['false_alarm'] for r in benign)}/{len(benign)}")
        latencies = sorted(r["latency"] for r in members if r["latency"] is not None and r["kind"])
        if latencies:
            parts.append(
                f"latency (correct kind) median {latencies[len(latencies) // 2]:.2f} s, max {latencies[-1]:.2f} s"
            )
        lines.append(f"{label} ({len(members)} cases): " + ", ".join(parts))
    return lines


def misses(rows: list) -> list:
    """For each scored case with a failed check: what ddpwatch said instead."""
    lines = []
    for row in rows:
        checks = [row[c] for c in ("kind", "ranks", "line", "fix")]
        if not row["scored"] or all(check is not False for check in checks):
            continue
        got = row["said"]
        if got is None:
            lines.append(f"{row['case']}: no report (exit codes {row['exit_codes']})")
            continue
        where = f"{os.path.basename(got['file'] or '?')}:{got['line']}"
        lines.append(f"{row['case']}: said {got['kind']} ranks {got['ranks']} at {where}; fix: {got['fix'][:100]!r}")
    return lines
