"""Walks one scope of a module for `ddpwatch lint`: the rank condition and loops around each call."""

from __future__ import annotations

import ast

from .rankcond import is_rank_condition, rank_guarded_exit
from .lint_model import EarlyExit, Guard, Loop, Scope, Site, calls_in
from .lint_ranks import is_per_rank, mentions_rank

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_MATCH = getattr(ast, "Match", ())  # Python 3.10+; setup.cfg still allows 3.9
_TRY = (ast.Try, *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))  # try/except* is 3.11+


def header_line(lines: list[str], node: ast.stmt) -> str:
    """The source line a statement starts on, stripped and cut at 120 characters ('' past the end)."""
    if 1 <= node.lineno <= len(lines):
        return lines[node.lineno - 1].strip()[:120]
    return ""


class ScopeWalker:
    """Walks one scope's statements, recording each call with its innermost rank condition and loops."""

    def __init__(self, lines: list[str], scope: Scope):
        self.lines = lines
        self.scope = scope
        self.names = scope.rank_names

    def walk(self) -> None:
        self._block(self.scope.body, None, (), [], None)

    def _guard(self, node: ast.If | ast.While, kind: str) -> Guard:
        return Guard(node, kind, header_line(self.lines, node))

    def _block(
        self, stmts: list[ast.stmt], guard: Guard | None, loops: tuple[Loop, ...], chain: list, owner: ast.stmt | None
    ) -> None:
        exit_guard = None
        for index, stmt in enumerate(stmts):
            frames = chain + [(stmts, index, owner)]
            self._stmt(stmt, exit_guard or guard, loops, frames)
            exit_stmt = rank_guarded_exit(stmt, self.names)
            # an exit is found in an `if` only (rank_guarded_exit): isinstance says so to the type checker
            if exit_stmt is not None and isinstance(stmt, ast.If) and self._exit_applies(exit_stmt, loops):
                branch = stmt.body if stmt.body and stmt.body[-1] is exit_stmt else stmt.orelse
                self.scope.exits.append(EarlyExit(exit_stmt, branch, stmt, _skipped_by(exit_stmt, frames)))
                exit_guard = self._guard(stmt, "early_exit")

    def _exit_applies(self, exit_stmt: ast.stmt, loops: tuple[Loop, ...]) -> bool:
        if isinstance(exit_stmt, ast.Return):
            return self.scope.is_function
        return bool(loops)

    def _stmt(self, stmt: ast.stmt, guard: Guard | None, loops: tuple[Loop, ...], frames: list) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # decorators, defaults and base classes run here; the body is a scope of its own
            if isinstance(stmt, ast.ClassDef):
                extra = list(stmt.bases)
            else:
                extra = [*stmt.args.defaults, *[d for d in stmt.args.kw_defaults if d]]
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
            per_rank = mentions_rank(stmt.test, self.names, self.scope.per_rank_names)
            body_guard = self._guard(stmt, "while") if is_rank_condition(stmt.test, self.names) else guard
            self._block(stmt.body, body_guard, loops + (Loop(stmt, per_rank),), frames, stmt)
            self._block(stmt.orelse, guard, loops, frames, stmt)
            return
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            self._exprs([stmt.iter], guard, loops)
            per_rank = is_per_rank(stmt.iter, self.names, self.scope.per_rank_names)
            self._block(stmt.body, guard, loops + (Loop(stmt, per_rank),), frames, stmt)
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

    def _exprs(self, nodes: list[ast.AST], guard: Guard | None, loops: tuple[Loop, ...]) -> None:
        for call in calls_in(nodes):
            self.scope.sites.append(Site(call, guard, loops))


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
