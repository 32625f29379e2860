"""What `ddpwatch lint` reports and records: the checks, LintFinding, the walker's records, and the readers of a
scope's nodes (its calls, its bindings) the checks share."""

from __future__ import annotations

import ast
import dataclasses
from typing import Iterable, Iterator

from .. import catalogue
from .rankcond import scope_nodes

PARSE_ERROR = "DDP000"

# code -> (summary, generic hint); each finding carries its own, more specific hint.
CHECKS: dict[str, tuple[str, str]] = {
    "DDP001": (
        "DDP-wrapped model called on a subset of ranks",
        "call the wrapped module (`model.module(...)`) for rank-local work",
    ),
    "DDP002": (
        "collective called on a subset of ranks",
        "call the collective on every rank: move it out of the rank condition",
    ),
    "DDP003": (
        "rank-conditional early exit skips a later collective",
        "let every rank reach the collective: guard only the rank-local work",
    ),
    "DDP004": (
        "collective in a loop whose trip count depends on the rank",
        "give every rank the same number of iterations, or move the collective out of the loop",
    ),
}

# Collectives every rank of their group must call -> the position of their group argument (None: no group
# argument: new_group, which every rank of the default group must call). Point-to-point calls are left out: a
# rank-guarded send_object_list is how they are meant to be used.
COLLECTIVES: dict[str, int | None] = {
    name: entry.group_at for name, entry in catalogue.COLLECTIVES.items() if entry.op not in ("send", "recv")
}
# Hugging Face Accelerate methods that are collectives under the hood.
ACCELERATOR_COLLECTIVES = frozenset({"gather", "gather_for_metrics", "reduce", "pad_across_processes"})

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclasses.dataclass(frozen=True, order=True)
class LintFinding:
    """One problem `ddpwatch lint` found at one place of the source; `hint` says the fix.

    Named apart from the runtime findings (format.build.finding(): a hang seen in a running job), which are plain data.
    """

    path: str
    line: int
    col: int
    code: str
    message: str
    hint: str = ""

    def to_dict(self, hints: bool = True) -> dict:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "message": self.message,
            "hint": self.hint if hints else None,
        }

    def to_text(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"


# --- what the walker records -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Guard:
    """The innermost rank condition a statement runs under."""

    node: ast.If | ast.While
    kind: str  # "if", "else", "while", "early_exit"
    text: str  # its header line

    @property
    def line(self) -> int:
        return self.node.lineno

    def describe(self, line: int | None = None) -> str:
        """Where a call runs, relative to this guard; `line`: the call site, said first, with the guard's own line
        after it (a single 'at line' after the guard's text read as the guard's line)."""
        if self.kind == "else":
            where = f"in the else branch of `{self.text}`"
        elif self.kind == "early_exit":
            where = f"after the early exit `{self.text}`"
        else:
            where = f"under `{self.text}`"
        return f"{where} at line {self.line}" if line is None else f"at line {line}, {where} (line {self.line})"


@dataclasses.dataclass(frozen=True)
class Loop:
    node: ast.stmt
    per_rank: bool


@dataclasses.dataclass(frozen=True)
class Site:
    """A call, with the rank condition and loops around it in its own function."""

    call: ast.Call
    guard: Guard | None
    loops: tuple[Loop, ...]


@dataclasses.dataclass(frozen=True)
class EarlyExit:
    exit: ast.stmt  # the return/continue/break
    branch: list[ast.stmt]  # the branch of the rank `if` that ends in it
    if_node: ast.If
    skipped: list[ast.stmt]  # statements the exiting ranks no longer run


@dataclasses.dataclass
class ClassInfo:
    node: ast.ClassDef
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
    wrapped_attrs: set[str]
    bases: list[str]


@dataclasses.dataclass
class Scope:
    """A function body, or the module body."""

    node: ast.AST
    body: list[ast.stmt]
    is_function: bool
    cls: ClassInfo | None = None
    self_name: str | None = None
    params: list[str] = dataclasses.field(default_factory=list)
    rank_names: set[str] = dataclasses.field(default_factory=set)
    per_rank_names: set[str] = dataclasses.field(default_factory=set)
    timeline: dict[str, list[tuple[int, bool]]] = dataclasses.field(default_factory=dict)
    sites: list[Site] = dataclasses.field(default_factory=list)
    exits: list[EarlyExit] = dataclasses.field(default_factory=list)
    nested: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = dataclasses.field(default_factory=dict)
    nodes: list[ast.AST] = dataclasses.field(default_factory=list)  # scope_nodes(body), walked once
    parent: ast.AST | None = None  # the enclosing function, for nested functions


def nodes_in(nodes: Iterable[ast.AST]) -> list[ast.AST]:
    """Every node under `nodes`, not entering nested functions, classes or lambdas (they run elsewhere)."""
    return scope_nodes(list(nodes))


def calls_in(nodes: Iterable[ast.AST]) -> Iterator[ast.Call]:
    return (node for node in nodes_in(nodes) if isinstance(node, ast.Call))


def param_names(function: ast.AST) -> list[str]:
    if not isinstance(function, FUNCTIONS):
        return []
    args = function.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def bindings(nodes: list[ast.AST]) -> Iterator[tuple[ast.AST, ast.AST | None, int]]:
    """(target, value or None, line) for every binding among a scope's nodes."""
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _paired(target, node.value, node.lineno)
        elif isinstance(node, ast.AnnAssign):
            yield node.target, node.value, node.lineno
        elif isinstance(node, ast.NamedExpr):
            yield node.target, node.value, node.lineno
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor)):
            yield from _paired(node.target, None, node.lineno)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            yield from _paired(node.optional_vars, None, node.context_expr.lineno)


def _paired(target: ast.AST, value: ast.AST | None, line: int) -> Iterator[tuple[ast.AST, ast.AST | None, int]]:
    if isinstance(target, (ast.Tuple, ast.List)):
        values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
        if values is not None and len(values) != len(target.elts):
            values = None
        for index, element in enumerate(target.elts):
            yield from _paired(element, values[index] if values else None, line)
    elif isinstance(target, ast.Starred):
        yield from _paired(target.value, None, line)
    else:
        yield target, value, line
