"""What encloses a line of the user's source: its loops with their exits (and the `if` over each), the try around it."""

# Read when an incident is taken, kept in each rank's state as `code`: the analysis tells a rank that left a loop by a
# `break`/`return`, skipped part of an iteration by a `continue` or caught an exception from one whose data ran out,
# without reading a file itself.

from __future__ import annotations

import ast
import io
import os
import tokenize
from typing import Any, Mapping

from .loop_ends import (
    FUNCTIONS,
    LOOPS,
    SCOPES,
    counted,
    endless,
    function_named,
    Loop,
    rank_names,
    Scope,
)
from .rankcond import dotted_name, is_rank_condition, scope_nodes
from .source import parsed_file

__all__ = ["code_around", "code_around_source", "code_of_state"]

_TRIES = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)
_BLOCKS = tuple(t for t in (ast.stmt, ast.ExceptHandler, getattr(ast, "match_case", None)) if t is not None)
_EXIT_KINDS: dict[type, str] = {ast.Break: "break", ast.Continue: "continue", ast.Return: "return"}
MAX_LOOPS = 8  # enclosing loops kept per line, innermost first
MAX_EXITS = 32  # exits kept per loop, in line order
MAX_LINES = 64  # lines read per rank state
TEXT = 200  # characters of a header line kept


def _contains(node: ast.stmt | ast.ExceptHandler, line: int) -> bool:
    return node.lineno <= line <= (getattr(node, "end_lineno", None) or node.lineno)


def _in_block(block: list, line: int) -> bool:
    return any(_contains(stmt, line) for stmt in block)


def _children(node: ast.AST) -> list:
    """The statement blocks (and except handlers) directly inside a compound statement, loop bodies first."""
    found = []
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if isinstance(block, list):
            found.extend(block)
    found.extend(getattr(node, "handlers", ()) or ())
    for case in getattr(node, "cases", ()) or ():
        found.extend(case.body)
    return found


def _chain(tree: ast.Module, line: int) -> list:
    """The compound statements and except handlers holding `line`, outermost first."""
    chain: list = []
    nodes = list(tree.body)
    while True:
        holder = next((n for n in nodes if isinstance(n, (ast.stmt, ast.ExceptHandler)) and _contains(n, line)), None)
        if holder is None:
            return chain
        chain.append(holder)
        nodes = _children(holder)


def _header(lines: list, lineno: int) -> str:
    """The line, stripped, without its comment (`# LINE:tag`, `# noqa`)."""
    text = lines[lineno - 1].strip()[:TEXT] if 1 <= lineno <= len(lines) else ""
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                return text[: token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):  # a header continued on the next line: the comments seen so far
        pass
    return text


def _exits_of(loop: Loop, scope: "Scope") -> list:
    """The loop's exits: breaks and continues aimed at it, returns anywhere in it (nested functions excluded), each
    with the innermost `if` over it and the `except` it sits in, inside the loop."""
    return _exits_in(loop.body, scope, in_loop=True)


def _exits_in(body: list, scope: "Scope", in_loop: bool) -> list:
    """The exits of a block: with `in_loop`, its breaks and continues (outside nested loops) and every return; else
    its returns only (a function's body). Each with the innermost `if` over it and the `except` it sits in."""
    found: list = []

    def visit(node, nested_loop: bool, condition, handler) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, SCOPES) or not isinstance(child, _BLOCKS):
                continue
            kind = _EXIT_KINDS.get(type(child))
            if kind and (kind == "return" or not nested_loop):
                exit_ = {
                    "line": child.lineno,
                    "kind": kind,
                    "condition": condition and condition[0],
                    "handler": handler,
                }
                decided = _decided_in(condition[1], condition[0]["branch"], scope) if condition else None
                if decided:
                    exit_["decided_in"] = decided
                found.append(exit_)
            inner_handler = handler
            if isinstance(child, ast.ExceptHandler):
                inner_handler = {"line": child.lineno, "text": _header(scope.lines, child.lineno)}
                if _exhaustion(child):
                    inner_handler["exhausted"] = True
            if isinstance(child, ast.If):
                visit_branches(child, nested_loop, handler)
            else:
                visit(child, nested_loop or isinstance(child, LOOPS), condition, inner_handler)

    def visit_branches(node: ast.If, nested_loop: bool, handler) -> None:
        doc = _condition(node, scope.lines, scope.names)
        for branch, taken in ((node.body, "if"), (node.orelse, "else")):
            holder = ast.Module(body=branch, type_ignores=[])
            visit(holder, nested_loop, (dict(doc, branch=taken), node), handler)

    visit(ast.Module(body=body, type_ignores=[]), not in_loop, None, None)
    return sorted(found, key=lambda e: e["line"])[:MAX_EXITS]


def _condition(node: ast.If, lines: list, names: set) -> dict:
    return {
        "line": node.lineno,
        "text": _header(lines, node.lineno),
        "rank": bool(is_rank_condition(node.test, names)),
        "branch": "if",
    }


def _then(handler: ast.ExceptHandler) -> str:
    """What an except handler does last: continue, break, return, raise, pass, or falls (goes on after the try)."""
    last = handler.body[-1] if handler.body else None
    kinds: dict[type, str] = {
        ast.Continue: "continue",
        ast.Break: "break",
        ast.Return: "return",
        ast.Raise: "raise",
        ast.Pass: "pass",
    }
    return kinds.get(type(last), "falls")


# What an iterator raises when its data runs out: a handler of these alone ends a loop the way `for` does.
_EXHAUSTION = frozenset({"StopIteration", "StopAsyncIteration"})


def _exhaustion(handler: ast.ExceptHandler) -> bool:
    """`except StopIteration:` (or a tuple of such): the data ran out, no error was swallowed."""
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught] if caught is not None else []
    return bool(names) and all(dotted_name(n) in _EXHAUSTION for n in names)


def _try_doc(node: ast.Try, lines: list) -> dict:  # or an ast.TryStar (3.11+): the same fields
    body_end = max((getattr(s, "end_lineno", None) or s.lineno) for s in node.body)
    return {
        "line": node.lineno,
        "body_end": body_end,
        "handlers": [
            {"line": h.lineno, "end": h.end_lineno or h.lineno, "text": _header(lines, h.lineno), "then": _then(h)}
            for h in node.handlers
        ],
    }


def _around(tree: ast.Module, lines: list, line: int) -> dict:
    chain = _chain(tree, line)
    functions = [n for n in chain if isinstance(n, FUNCTIONS)]
    function = functions[-1] if functions else None
    inside = chain[chain.index(function) + 1 :] if function else chain
    scope = Scope(tree, lines, function, rank_names(tree, function))
    loops = [n for n in inside if isinstance(n, LOOPS) and _in_block(n.body, line)]
    tries = [n for n in inside if isinstance(n, _TRIES) and _in_block(n.body, line)]
    span = [function.lineno, function.end_lineno or function.lineno] if function else [1, max(len(lines), 1)]
    return {
        "function": span,
        "loops": [
            {
                "line": loop.lineno,
                "end": loop.end_lineno or loop.lineno,
                "text": _header(lines, loop.lineno),
                "endless": endless(loop, scope),
                "counted": counted(loop, scope),
                "exits": _exits_of(loop, scope),
            }
            for loop in reversed(loops)
        ][:MAX_LOOPS],
        "tries": [_try_doc(node, lines) for node in reversed(tries)][:MAX_LOOPS],
        "returns": _exits_in(function.body, scope, in_loop=False) if function else [],
    }


# ---------------------------------------------------------------- a condition that tests what a helper returned


def _decided_in(node: ast.If, branch: str, scope: Scope) -> dict | None:
    """For `x = helper(...)` then `if x is None:` (or `not x`, `x == 0`...) over an exit: the one `return` of
    `helper` (a function of this file) whose constant value takes that branch, under a condition of its own. The
    decision was made there; the caller only passes it on."""
    tested = _tested_name(node.test)
    if tested is None or scope.function is None:
        return None
    calls = [value for line, value in _assigned_before(tested, node.lineno, scope)]
    if len(calls) != 1 or not isinstance(calls[0], ast.Call):
        return None
    helper = function_named(scope.tree, (dotted_name(calls[0].func) or "").split(".")[-1])
    if helper is None or helper is scope.function:
        return None
    inner = Scope(scope.tree, scope.lines, helper, rank_names(scope.tree, helper))
    taken = []
    for ret in _exits_in(helper.body, inner, in_loop=False):
        value = _returned(helper, ret["line"])
        if value is not _UNKNOWN and ret["condition"] and _takes(node.test, tested, value) == (branch == "if"):
            taken.append(ret)
    if len(taken) != 1:
        return None
    ret = taken[0]
    return {
        "line": ret["line"],
        "function": helper.name,
        "text": _header(scope.lines, ret["line"]),
        "condition": ret["condition"],
    }


_UNKNOWN = object()


def _tested_name(test: ast.AST) -> str | None:
    """The one name a test reads (`x is None`, `not x`, `x`, `x == 0`), compared with constants only."""
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    return names.pop() if len(names) == 1 and _evaluable(test) else None


def _evaluable(node: ast.AST) -> bool:
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _evaluable(node.operand)
    if isinstance(node, ast.BoolOp):
        return all(_evaluable(v) for v in node.values)
    if isinstance(node, ast.Compare):
        return (
            len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq))
            and all(isinstance(v, (ast.Name, ast.Constant)) for v in (node.left, *node.comparators))
        )
    return False


def _takes(test: ast.AST, name: str, value) -> bool | None:
    """The test's truth with `name` bound to `value` (None when it cannot be told)."""
    try:
        return bool(_evaluate(test, name, value))
    except Exception:  # noqa: BLE001 - a value the test cannot be applied to: no answer
        return None


def _evaluate(node: ast.AST, name: str, value):
    if isinstance(node, ast.Name):
        return value
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        return not _evaluate(node.operand, name, value)
    if isinstance(node, ast.BoolOp):
        results = [bool(_evaluate(v, name, value)) for v in node.values]
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if not isinstance(node, ast.Compare):  # _evaluable() let only comparisons through past this point
        raise TypeError(f"cannot evaluate {type(node).__name__}")
    left, right = _evaluate(node.left, name, value), _evaluate(node.comparators[0], name, value)
    op = node.ops[0]
    return {
        ast.Is: lambda: left is right,
        ast.IsNot: lambda: left is not right,
        ast.Eq: lambda: left == right,
        ast.NotEq: lambda: left != right,
    }[type(op)]()


def _assigned_before(name: str, line: int, scope: Scope) -> list:
    """The last plain assignment `name = ...` above `line` in the function (as [(line, value)]), [] if none."""
    if scope.function is None:
        return []
    found = [
        (node.lineno, node.value)
        for node in scope_nodes(scope.function.body)
        if isinstance(node, ast.Assign)
        and node.lineno < line
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    return [max(found, key=lambda pair: pair[0])] if found else []


def _returned(function, line: int):
    """The constant a `return` at `line` of `function` gives (None for a bare return), else _UNKNOWN."""
    for node in scope_nodes(function.body):
        if isinstance(node, ast.Return) and node.lineno == line:
            if node.value is None:
                return None
            try:
                return ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return _UNKNOWN
    return _UNKNOWN


def code_around_source(source: str, line: int) -> dict | None:
    """`code_around` for source text (tests, and callers that hold the text); None for bad input."""
    try:
        return _around(ast.parse(source), source.splitlines(), line)
    except Exception:  # noqa: BLE001 - a hint: bad input is no hint, never an error
        return None


def code_around(path: str, line: int) -> dict | None:
    """What encloses `line` of the file at `path`: {"function": [first, last line], "loops": [...], "tries": [...]},
    loops and tries innermost first; None when the file is missing, unreadable or unparsable.

    A loop: {"line", "end", "text" (its header), "endless" (`while True:`), "exits": [{"line", "kind" (break,
    continue, return), "condition" ({"line", "text", "rank", "branch"} of the innermost `if` over it, or None),
    "handler" ({"line", "text"} of the `except` it sits in, or None)}]}. A try whose body holds the line: {"line",
    "body_end", "handlers": [{"line", "text", "then" (continue, break, return, raise, pass, falls)}]}.
    """
    try:
        if not isinstance(line, int) or isinstance(line, bool) or line < 1:
            return None
        tree, lines = parsed_file(os.fspath(path))
        return None if tree is None else _around(tree, lines, line)
    except Exception:  # noqa: BLE001 - read while an incident is taken: a guess must not become a crash
        return None


def _lines_of(state: Mapping[str, Any]) -> list:
    """(file, line) of the user's lines a rank state names: its main-thread frames, then its records' sites."""
    found: dict = {}
    for stack in state.get("stacks") or ():
        if isinstance(stack, dict) and stack.get("main"):
            for frame in stack.get("frames") or ():
                if isinstance(frame, dict) and not frame.get("internal") and not frame.get("library"):
                    found[(frame.get("file"), frame.get("line"))] = None
    for record in list(state.get("inflight") or ()) + list(state.get("recent") or ()):
        for site in (record.get("site"), (record.get("region") or {}).get("site")):
            if isinstance(site, dict):  # a send's or recv's too: analysis/p2p.py reads what comes before it
                found[(site.get("file"), site.get("line"))] = None
    return [(f, n) for f, n in found if isinstance(f, str) and isinstance(n, int) and not f.startswith("<")]


def code_of_state(state: Mapping[str, Any], user_file=None) -> dict:
    """{"file:line": code_around(...)} for the user's lines of a rank state (`user_file(path)`: whether a record's file
    is the user's, when the caller can tell; frames say it themselves). Lines whose source cannot be read are left
    out; nothing here raises."""
    code: dict = {}
    try:
        for file, line in _lines_of(state)[:MAX_LINES]:
            if user_file is not None and not user_file(file):
                continue
            around = code_around(file, line)
            if around is not None:
                code[f"{file}:{line}"] = around
    except Exception:  # noqa: BLE001 - same reason as code_around
        pass
    return code
