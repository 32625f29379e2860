"""Every measured figure in README names where it comes from (issue 43 item 3): the command that gives it, the commit
it was measured at and the machine, in the same paragraph, list item or table (or the sentence that introduces the
table); "simulated" where ranks were simulated. Settings (`grace` (0.5 s), a default) are not figures."""

import os
import re

import pytest

from ranks import ROOT

README = os.path.join(ROOT, "README.md")
# A measured quantity: a number (or a range) with a unit of time, size or share, or a ratio such as 0.97 or 1.18.
FIGURE = re.compile(
    r"(?<![\w.`])\d[\d,]*(?:\.\d+)?(?:(?:-| to | \.\. )\+?\d[\d,]*(?:\.\d+)?)?\s?(?:us|ms|s|%|MiB|KiB|x)(?![\w])"
    r"|(?<![\w.])[01]\.\d\d(?![\d.])"
)
# A setting, a bound or a period the code or a test sets, named as such: `grace` (0.5 s), (default 300 s),
# `dead_after` (10 s), at most 3 s, one per 20 s, every 0.1 s, a 60 s limit, 0.5 x `interval`, >= 0.05. Not a
# measurement, so it needs no source.
SETTING = re.compile(
    r"`\w+` \((?:default )?[\d.]+ s\)|\(default [\d.]+ s\)|`\w+_S`, [\d.]+ s"
    r"|\b(?:at most|one per|once per|per|every|for|up to|plus|after|within(?: the(?: same)?)?|here|default|past"
    r"|limit of|limits:|timeout|grace|interval|dead_after)\s+\(?[\d.]+\s?(?:s|ms|MiB|KiB)\b"
    r"|\b[\d.]+ ?s (?:limit|timeout)\b|\b[\d.]+ x `?\w+`?|>= ?[\d.]+|\bfirst [\d.]+ s\b"
    r"|`[A-Z][A-Z_]+`, [\d.]+ ?(?:s|ms|%|MiB|KiB)\b|[\d.]+ ?(?:s|%) of the time since \(`[A-Z][A-Z_]+`\)"
)
COMMAND = re.compile(r"python -[mc] [\w.]+|python -c\b|benchmarks/\w+\.py|tests/[\w/]+\.py|docs/tools/\w+\.py")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
MACHINE = re.compile(r"2-core|2-CPU|this machine|another CPU")
PAGE_NOTE = "Figures on this page"


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


def headings_above(text: str) -> dict:
    """{line number: the headings that line sits under, outermost first, joined}: a docs page's section may name
    the command, commit and machine of every figure in it once, in its heading."""
    chain, above = [], {}
    for number, line in enumerate(text.splitlines(), 1):
        level = len(line) - len(line.lstrip("#"))
        if line.startswith("#") and line[level : level + 1] == " ":
            chain = [*chain[: level - 1], *[""] * (level - 1 - len(chain)), line]
        above[number] = "\n".join(chain)
    return above


def page_note(text: str) -> str:
    """The page's own statement of where its figures come from ("Figures on this page: ..."), or ""."""
    return "\n".join(block for _, block in blocks(text) if block.lstrip("*").startswith(PAGE_NOTE))


def unsourced(text: str, sections: bool = False) -> list:
    """[(line, the figures, what is missing)] for each block whose figures do not say where they come from: in the
    block itself (README), or also in the headings above it and the page's note (`sections`, docs/)."""
    missing = []
    above, note = (headings_above(text), page_note(text)) if sections else ({}, "")
    for line, block in blocks(text):
        figures = FIGURE.findall(SETTING.sub("", block))
        if not figures:
            continue
        source = "\n".join((block, above.get(line, ""), note))
        lacks = [
            name
            for name, pattern in (("command", COMMAND), ("commit", COMMIT), ("machine", MACHINE))
            if not pattern.search(source)
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


DOCS = sorted(
    os.path.join(ROOT, "docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")
)


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_every_figure_in_docs_names_its_command_commit_and_machine(path):
    """The same rule in docs/, where a section may name its source once in its heading and a page its machine once
    ("Figures on this page ..."), which every figure under it shares."""
    with open(path, encoding="utf-8") as handle:
        missing = unsourced(handle.read(), sections=True)
    assert not missing, "\n".join(
        f"{os.path.basename(path)}:{line}: {figures} without its {', '.join(lacks)}" for line, figures, lacks in missing
    )


def test_a_section_or_page_names_the_source_once_for_the_figures_under_it():
    page = "# Costs\n\n**Figures on this page**: this 2-core machine.\n\n## Per op ({}, 078ebd6)\n\nIt adds 3.7 us.\n"
    assert not unsourced(page.format("`python -m benchmarks.overhead_ops`"), sections=True)
    assert unsourced(page.format("a command nobody wrote down"), sections=True)  # the heading lacks the command
    assert unsourced(page.replace("this 2-core machine", "somewhere"), sections=True)  # and now the machine
    assert unsourced(page.format("`python -m benchmarks.overhead_ops`"))  # README's rule: in the paragraph itself
    other_section = page.format("`python -m benchmarks.overhead_ops`") + "\n## Elsewhere\n\nIt took 2.5 s.\n"
    assert unsourced(other_section, sections=True)  # a heading names the source of its own section only
