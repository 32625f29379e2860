"""`ddpwatch lint` and `python -m ddpwatch.lint`: the linter's public names, which live in ddpwatch.static.lint."""

from __future__ import annotations

import sys

from .static.lint import (
    CHECKS,
    COLLECTIVES,
    PARSE_ERROR,
    LintFinding,
    iter_python_files,
    lint_file,
    lint_paths,
    lint_source,
    main,
)

__all__ = [
    "CHECKS",
    "COLLECTIVES",
    "PARSE_ERROR",
    "LintFinding",
    "lint_source",
    "lint_file",
    "lint_paths",
    "iter_python_files",
    "main",
]

if __name__ == "__main__":
    sys.exit(main())
