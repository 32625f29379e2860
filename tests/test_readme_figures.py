"""Every measured figure in README names where it comes from (issue 43 item 3): the command that gives it, the commit
it was measured at and the machine, in the same paragraph, list item or table (or the sentence that introduces the
table); "simulated" where ranks were simulated. Settings (`grace` (0.5 s), a default) are not figures."""

import os
import re

from ranks import ROOT

README = os.path.join(ROOT, "README.md")
# A measured quantity: a number (or a range) with a unit of time, size or share, or a ratio such as 0.97 or 1.18.
FIGURE = re.compile(
    r"(?<![\w.`])\d[\d,]*(?:\.\d+)?(?:(?:-| to | \.\. )\+?\d[\d,]*(?:\.\d+)?)?\s?(?:us|ms|s|%|MiB|KiB|x)(?![\w])"
    r"|(?<![\w.])[01]\.\d\d(?![\d.])"
)
# A setting or a documented default, named as such: `grace` (0.5 s), (default 300 s), `dead_after` (10 s).
SETTING = re.compile(r"`\w+` \((?:default )?[\d.]+ s\)|\(default [\d.]+ s\)|`PY_SPY_TIMEOUT_S`, [\d.]+ s")
COMMAND = re.compile(r"python -m benchmarks(?:\.\w+)?|benchmarks/\w+\.py|tests/[\w/]+\.py")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
MACHINE = re.compile(r"2-core|2-CPU|this machine|another CPU")


def blocks(text: str) -> list:
    """README cut into paragraphs, list items and tables (a table with the paragraph just above it), fenced code
    left out: [(first line number, text)]."""
    lines = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S).splitlines()
    found, current, start = [], [], 0
    for number, line in enumerate(lines, 1):
        blank_or_heading = not line.strip() or line.startswith("#")
        if blank_or_heading or (re.match(r"\s*(?:- |\d+\. )", line) and current):
            if current and not (not line.strip() and _table_follows(lines, number)):
                found.append((start, "\n".join(current)))
                current = []
            if blank_or_heading:
                continue
        if not current:
            start = number
        current.append(line)
    if current:
        found.append((start, "\n".join(current)))
    return found


def _table_follows(lines: list, number: int) -> bool:
    """Whether the line after blank line `number` starts a table (the paragraph above introduces it)."""
    return number < len(lines) and lines[number].startswith("|")


def unsourced(text: str) -> list:
    """[(line, the figures, what is missing)] for each block whose figures do not say where they come from."""
    missing = []
    for line, block in blocks(text):
        figures = FIGURE.findall(SETTING.sub("", block))
        if not figures:
            continue
        lacks = [
            name
            for name, pattern in (("command", COMMAND), ("commit", COMMIT), ("machine", MACHINE))
            if not pattern.search(block)
        ]
        if lacks:
            missing.append((line, figures[:4], lacks))
    return missing


def test_every_figure_in_readme_names_its_command_commit_and_machine():
    with open(README, encoding="utf-8") as handle:
        missing = unsourced(handle.read())
    assert not missing, "\n".join(
        f"README.md:{line}: {figures} without its {', '.join(lacks)}" for line, figures, lacks in missing
    )


def test_the_check_finds_a_figure_without_its_source_and_takes_settings_for_settings():
    assert unsourced("The verdict comes 0.63 s after the hang forms.\n")
    assert unsourced("| job | ratio |\n|---|---|\n| ddp | 0.97 |\n")
    assert unsourced("- per op: 3.7-5.5 us on the fake process group (`python -m benchmarks.overhead_ops`)\n")
    sourced = "- per op: 3.7-5.5 us (`python -m benchmarks.overhead_ops`, 078ebd6, this 2-core machine)\n"
    assert not unsourced(sourced)
    assert not unsourced(
        "Caption (`python -m benchmarks.whole_job`, 078ebd6, 2-core):\n\n| job | r |\n|---|---|\n| a | 0.97 |\n"
    )
    assert not unsourced("every rank has sat for `grace` (0.5 s) in a collective, after `timeout` (default 300 s)\n")
    assert not unsourced("torch==2.13.0 and `torch>=2.1,<3`; rank 1 of 2\n")
