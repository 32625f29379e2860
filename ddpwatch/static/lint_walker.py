"""Walks one scope of a module for `ddpwatch lint`: the rank condition and loops around each call."""

from __future__ import annotations

import ast
import re
from typing import Any, Iterator

from .rankcond import is_rank_condition, rank_guarded_exit
from .lint_model import _LOOPS, _MATCH, _NOQA, _TRY, LintFinding, _EarlyExit, _Guard, _Loop, _Scope, _Site, _calls_in


def _same_callee(call: ast.Call, other: ast.Call) -> bool:
    return ast.dump(call.func) == ast.dump(other.func)


def _header(lines: list[str], node: ast.AST) -> str:
    if 1 <= node.lineno <= len(lines):
        return lines[node.lineno - 1].strip()[:120]
    return ""


def _bindings(nodes: list[ast.AST]) -> Iterator[tuple[ast.AST, ast.AST | None, int]]:
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


class _ScopeWalker:
    """Walks one scope's statements, recording each call with its innermost rank condition and loops."""

    def __init__(self, checker: Any, scope: _Scope):  # lint_checker._ModuleChecker: not imported (no import cycle)
        self.checker = checker
        self.scope = scope
        self.names = scope.rank_names

    def walk(self) -> None:
        self._block(self.scope.body, None, (), [], None)

    def _guard(self, node: ast.stmt, kind: str) -> _Guard:
        return _Guard(node, kind, _header(self.checker.lines, node))

    def _block(
        self, stmts: list[ast.stmt], guard: _Guard | None, loops: tuple[_Loop, ...], chain: list, owner: ast.stmt | None
    ) -> None:
        exit_guard = None
        for index, stmt in enumerate(stmts):
            frames = chain + [(stmts, index, owner)]
            self._stmt(stmt, exit_guard or guard, loops, frames)
            exit_stmt = rank_guarded_exit(stmt, self.names)
            if exit_stmt is not None and self._exit_applies(exit_stmt, loops):
                branch = stmt.body if stmt.body and stmt.body[-1] is exit_stmt else stmt.orelse
                self.scope.exits.append(_EarlyExit(exit_stmt, branch, stmt, _skipped_by(exit_stmt, frames)))
                exit_guard = self._guard(stmt, "early_exit")

    def _exit_applies(self, exit_stmt: ast.stmt, loops: tuple[_Loop, ...]) -> bool:
        if isinstance(exit_stmt, ast.Return):
            return self.scope.is_function
        return bool(loops)

    def _stmt(self, stmt: ast.stmt, guard: _Guard | None, loops: tuple[_Loop, ...], frames: list) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # decorators, defaults and base classes run here; the body is a scope of its own
            args = getattr(stmt, "args", None)
            extra = [*args.defaults, *[d for d in args.kw_defaults if d]] if args else list(stmt.bases)
            self._exprs([*stmt.decorator_list, *extra], guard, loops)
            return
        if isinstance(stmt, ast.If):
            self._exprs([stmt.test], guard, loops)
            rank_if = is_rank_condition(stmt.test, self.names)
            self._block(stmt.body, self._guard(stmt, "if") if rank_if else guard, loops, frames, stmt)
            self._block(stmt.orelse, self._guard(stmt, "else") if rank_if else guard, loops, frames, stmt)
            return
        if isinstance(stmt, ast.While):
            self._exprs([stmt.test], guard, loops)
            per_rank = self.checker._mentions_rank(stmt.test, self.names, self.scope.per_rank_names)
            body_guard = self._guard(stmt, "while") if is_rank_condition(stmt.test, self.names) else guard
            self._block(stmt.body, body_guard, loops + (_Loop(stmt, per_rank),), frames, stmt)
            self._block(stmt.orelse, guard, loops, frames, stmt)
            return
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            self._exprs([stmt.iter], guard, loops)
            per_rank = self.checker._is_per_rank(stmt.iter, self.names, self.scope.per_rank_names)
            self._block(stmt.body, guard, loops + (_Loop(stmt, per_rank),), frames, stmt)
            self._block(stmt.orelse, guard, loops, frames, stmt)
            return
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            self._exprs([item.context_expr for item in stmt.items], guard, loops)
            self._block(stmt.body, guard, loops, frames, stmt)
            return
        if isinstance(stmt, _TRY):
            self._block(stmt.body, guard, loops, frames, stmt)
            for handler in stmt.handlers:
                self._exprs([handler.type] if handler.type else [], guard, loops)
                self._block(handler.body, guard, loops, frames, stmt)
            self._block(stmt.orelse, guard, loops, frames, stmt)
            self._block(stmt.finalbody, guard, loops, frames, stmt)
            return
        if isinstance(stmt, _MATCH):
            self._exprs([stmt.subject], guard, loops)
            for case in stmt.cases:
                self._exprs([case.guard] if case.guard else [], guard, loops)
                self._block(case.body, guard, loops, frames, stmt)
            return
        self._exprs([stmt], guard, loops)

    def _exprs(self, nodes: list[ast.AST], guard: _Guard | None, loops: tuple[_Loop, ...]) -> None:
        for call in _calls_in(nodes):
            self.scope.sites.append(_Site(call, guard, loops))


def _skipped_by(exit_stmt: ast.stmt, frames: list) -> list[ast.stmt]:
    """Statements that ranks taking `exit_stmt` no longer run, up to the function or loop it leaves.

    A `return` skips the rest of every enclosing block, and the later iterations of every enclosing loop;
    a `break` skips the rest of the loop body and the loop's later iterations; a `continue` only the rest
    of the loop body.
    """
    skipped: list[ast.stmt] = []
    for block, index, owner in reversed(frames):
        skipped.extend(block[index + 1 :])
        if isinstance(owner, _LOOPS) and block is owner.body:
            if isinstance(exit_stmt, ast.Continue):
                break
            skipped.extend(owner.body)
            skipped.extend(owner.orelse)
            if isinstance(exit_stmt, ast.Break):
                break
    return skipped


# --- files and paths ----------------------------------------------------------------------------------------


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
