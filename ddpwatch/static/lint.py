"""`ddpwatch lint`: a static checker (stdlib ast only) that finds distributed-training hangs before they run."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from typing import Iterable, Sequence

from .lint_checker import ModuleChecker
from .lint_model import CHECKS, COLLECTIVES, PARSE_ERROR, LintFinding  # noqa: F401
from .source import read_source

__all__ = ["CHECKS", "LintFinding", "lint_source", "lint_file", "lint_paths", "iter_python_files", "main"]

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*))?", re.I)
# Every finding needs a DDP wrapper or a collective, and each of those needs one of these in the text.
_RELEVANT_MARKERS = ("distributed", "dist.", "DDP", "DistributedDataParallel", "wait_for_everyone", "accelerator")
_SKIPPED_DIRS = frozenset({"__pycache__", "venv", "env", "site-packages", "node_modules"})


def lint_source(source: str, path: str = "<string>") -> list[LintFinding]:
    """All findings in `source`, sorted, `# noqa` applied. Raises SyntaxError (or ValueError) if it won't parse."""
    tree = ast.parse(source, filename=path)
    if not any(marker in source for marker in _RELEVANT_MARKERS):
        return []  # nothing distributed in sight: skip the analysis (a large speed-up on whole trees)
    lines = source.splitlines()
    findings = ModuleChecker(tree, source, path).check()
    return [finding for finding in findings if not _suppressed(finding, lines)]


def _suppressed(finding: LintFinding, lines: list[str]) -> bool:
    """`# noqa` silences every finding on its line; `# noqa: DDP001,DDP002` only those codes."""
    if not 1 <= finding.line <= len(lines):
        return False
    match = _NOQA.search(lines[finding.line - 1])
    if match is None:
        return False
    codes = match.group("codes")
    if codes is None:
        return True
    return finding.code in {code.upper() for code in re.split(r"[\s,]+", codes) if code}


def _parse_error(path: str, error: Exception) -> LintFinding:
    line = getattr(error, "lineno", None) or 1
    col = getattr(error, "offset", None) or 1
    detail = getattr(error, "msg", None) or str(error) or type(error).__name__
    return LintFinding(
        path,
        line,
        col,
        PARSE_ERROR,
        f"could not parse: {type(error).__name__}: {detail}",
        "fix the syntax error; the file was not checked",
    )


def lint_file(path: str) -> list[LintFinding]:
    """Findings in one file; a file that cannot be read or parsed gives one DDP000 finding."""
    try:
        return lint_source(read_source(path), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError) as error:
        return [_parse_error(path, error)]


def _is_skipped_dir(parent: str, name: str) -> bool:
    if name.startswith(".") or name in _SKIPPED_DIRS:
        return True
    return os.path.exists(os.path.join(parent, name, "pyvenv.cfg"))  # a virtual environment by another name


def iter_python_files(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """(files to check, paths that do not exist). Folders are searched for *.py, skipping hidden
    folders, virtual environments and __pycache__; a file named explicitly is checked whatever its name."""
    files: list[str] = []
    missing: list[str] = []
    for path in paths:
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            for parent, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not _is_skipped_dir(parent, d))
                files.extend(os.path.join(parent, n) for n in sorted(names) if n.endswith(".py"))
        else:
            missing.append(path)
    return files, missing


def lint_paths(paths: Sequence[str]) -> list[LintFinding]:
    """Findings in every Python file under `paths` (DDP000 for files that do not parse)."""
    files, _ = iter_python_files(paths)
    return [finding for path in files for finding in lint_file(path)]


# --- command line -------------------------------------------------------------------------------------------


class _UsageError(Exception):
    pass


def _codes(text: str | None) -> list[str]:
    return [code.strip().upper() for code in (text or "").split(",") if code.strip()]


def _check_known(codes: list[str], option: str) -> None:
    for code in codes:
        if not any(known.startswith(code) for known in CHECKS):
            raise _UsageError(f"{option}: unknown code {code!r} (known: {', '.join(CHECKS)})")


def _enabled_codes(select: list[str], ignore: list[str], default_ignore: Iterable[str]) -> set[str]:
    """Codes to report. `--select` picks codes (prefixes allowed) and overrides `default_ignore`;
    `--ignore` and `default_ignore` take codes away."""
    chosen = {code for code in CHECKS if not select or any(code.startswith(s) for s in select)}
    dropped = list(ignore) + ([] if select else [c.strip().upper() for c in default_ignore if c.strip()])
    return {code for code in chosen if not any(code.startswith(d) for d in dropped)}


def _parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {code}  {summary}" for code, (summary, _) in CHECKS.items())
    parser = argparse.ArgumentParser(
        prog="ddpwatch lint",
        description="Find distributed-training hangs in Python source before it runs.",
        epilog=f"checks:\n{codes}\n\nexit status: 0 clean, 1 findings, 2 usage error or a file that did not "
        "parse.\nsilence one line with `# noqa: DDP001` (or a bare `# noqa`).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders (searched for *.py)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("--select", metavar="CODES", help="comma-separated codes (or prefixes) to report")
    parser.add_argument("--ignore", metavar="CODES", help="comma-separated codes (or prefixes) to skip")
    parser.add_argument("--no-hints", action="store_true", help="leave out the fix hints")
    return parser


def _print_findings(findings: list[LintFinding], output_format: str, hints: bool) -> None:
    if output_format == "json":
        print(json.dumps([finding.to_dict(hints) for finding in findings], indent=2))
        return
    for finding in findings:
        print(finding.to_text())
        if hints and finding.hint:
            print(f"    hint: {finding.hint}")


def main(argv: list[str] | None = None, *, default_ignore: tuple[str, ...] = ()) -> int:
    """Run `ddpwatch lint`; returns 0 when clean, 1 when something was found, 2 on usage or parse errors.

    `default_ignore` holds codes turned off by configuration; `--ignore` adds to it, `--select` overrides it.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help and on usage errors; callers want a status
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        select, ignore = _codes(args.select), _codes(args.ignore)
        _check_known(select, "--select")
        _check_known(ignore, "--ignore")
    except _UsageError as error:
        parser.print_usage(sys.stderr)
        print(f"ddpwatch lint: error: {error}", file=sys.stderr)
        return 2
    enabled = _enabled_codes(select, ignore, default_ignore)
    files, missing = iter_python_files(args.paths)
    for path in missing:
        print(f"ddpwatch lint: error: {path}: no such file or folder", file=sys.stderr)
    findings = [f for path in files for f in lint_file(path) if f.code == PARSE_ERROR or f.code in enabled]
    _print_findings(findings, args.format, hints=not args.no_hints)
    parse_errors = sum(1 for f in findings if f.code == PARSE_ERROR)
    problems = len(findings) - parse_errors
    print(
        f"ddpwatch lint: {len(files)} file(s) checked, {problems} problem(s) found"
        + (f", {parse_errors} file(s) could not be parsed" if parse_errors else ""),
        file=sys.stderr,
    )
    if missing or parse_errors:
        return 2
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
