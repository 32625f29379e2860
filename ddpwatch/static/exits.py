"""What encloses a line of the user's source: its loops with their exits (and the `if` over each), the try around it."""

# Read when an incident is taken, kept in each rank's state as `code`: the analysis tells a rank that left a loop by a
# `break`/`return`, skipped part of an iteration by a `continue` or caught an exception from one whose data ran out,
# without reading a file itself.

from __future__ import annotations

import ast
import io
import os
import tokenize

from .rankcond import function_rank_names, is_rank_condition, module_rank_names
from .source import parsed_file

__all__ = ["code_around", "code_around_source", "code_of_state"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_TRIES = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)
_BLOCKS = tuple(t for t in (ast.stmt, ast.ExceptHandler, getattr(ast, "match_case", None)) if t is not None)
_EXIT_KINDS = {ast.Break: "break", ast.Continue: "continue", ast.Return: "return"}
MAX_LOOPS = 8  # enclosing loops kept per line, innermost first
MAX_EXITS = 32  # exits kept per loop, in line order
MAX_LINES = 64  # lines read per rank state
TEXT = 200  # characters of a header line kept


def _contains(node: ast.AST, line: int) -> bool:
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
    chain, nodes = [], list(tree.body)
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
                return text[:token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):  # a header continued on the next line: the comments seen so far
        pass
    return text


def _exits_of(loop: ast.AST, lines: list, names: set) -> list:
    """The loop's exits: breaks and continues aimed at it, returns anywhere in it (nested functions excluded), each
    with the innermost `if` over it and the `except` it sits in, inside the loop."""
    found: list = []

    def visit(node, nested_loop: bool, condition, handler) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES) or not isinstance(child, _BLOCKS):
                continue
            kind = _EXIT_KINDS.get(type(child))
            if kind and (kind == "return" or not nested_loop):
                found.append({"line": child.lineno, "kind": kind, "condition": condition, "handler": handler})
            inner_condition, inner_handler = condition, handler
            if isinstance(child, ast.If):
                inner_condition = _condition(child, lines, names)
            if isinstance(child, ast.ExceptHandler):
                inner_handler = {"line": child.lineno, "text": _header(lines, child.lineno)}
            if isinstance(child, ast.If):
                visit_branches(child, nested_loop, inner_condition, handler)
            else:
                visit(child, nested_loop or isinstance(child, _LOOPS), inner_condition, inner_handler)

    def visit_branches(node: ast.If, nested_loop: bool, condition, handler) -> None:
        for branch, taken in ((node.body, "if"), (node.orelse, "else")):
            holder = ast.Module(body=branch, type_ignores=[])
            visit(holder, nested_loop, dict(condition, branch=taken), handler)

    visit(ast.Module(body=loop.body, type_ignores=[]), False, None, None)
    return sorted(found, key=lambda e: e["line"])[:MAX_EXITS]


def _condition(node: ast.If, lines: list, names: set) -> dict:
    return {"line": node.lineno, "text": _header(lines, node.lineno), "rank": bool(is_rank_condition(node.test, names)),
            "branch": "if"}


def _endless(loop: ast.AST) -> bool:
    """`while True:` (or `while 1:`): it ends only by an exit."""
    return isinstance(loop, ast.While) and isinstance(loop.test, ast.Constant) and bool(loop.test.value) is True


def _then(handler: ast.ExceptHandler) -> str:
    """What an except handler does last: continue, break, return, raise, pass, or falls (goes on after the try)."""
    last = handler.body[-1] if handler.body else None
    kinds = {ast.Continue: "continue", ast.Break: "break", ast.Return: "return", ast.Raise: "raise", ast.Pass: "pass"}
    return kinds.get(type(last), "falls")


def _try_doc(node: ast.AST, lines: list) -> dict:
    body_end = max((getattr(s, "end_lineno", None) or s.lineno) for s in node.body)
    return {"line": node.lineno, "body_end": body_end,
            "handlers": [{"line": h.lineno, "text": _header(lines, h.lineno), "then": _then(h)} for h in node.handlers]}


def _rank_names(tree: ast.Module, function) -> set:
    """The rank names in scope at `function` (the module's when None), computed once per tree and function."""
    key = (id(tree), id(function))
    cached = _names.get(key)
    if cached is None or cached[0] is not tree:
        if len(_names) > 256:
            _names.clear()
        names = module_rank_names(tree) if function is None else function_rank_names(function, _rank_names(tree, None))
        cached = _names[key] = (tree, names)
    return cached[1]


_names: dict = {}  # (id(tree), id(function)) -> (tree, rank names): the tree is kept, so its ids name it


def _around(tree: ast.Module, lines: list, line: int) -> dict:
    chain = _chain(tree, line)
    functions = [n for n in chain if isinstance(n, _FUNCTIONS)]
    function = functions[-1] if functions else None
    inside = chain[chain.index(function) + 1:] if function else chain
    names = _rank_names(tree, function)
    loops = [n for n in inside if isinstance(n, _LOOPS) and _in_block(n.body, line)]
    tries = [n for n in inside if isinstance(n, _TRIES) and _in_block(n.body, line)]
    span = [function.lineno, function.end_lineno or function.lineno] if function else [1, max(len(lines), 1)]
    return {"function": span,
            "loops": [{"line": loop.lineno, "end": loop.end_lineno or loop.lineno, "text": _header(lines, loop.lineno),
                       "endless": _endless(loop), "exits": _exits_of(loop, lines, names)}
                      for loop in reversed(loops)][:MAX_LOOPS],
            "tries": [_try_doc(node, lines) for node in reversed(tries)][:MAX_LOOPS]}


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


def _lines_of(state: dict) -> list:
    """(file, line) of the user's lines a rank state names: its main-thread frames, then its records' sites."""
    found: dict = {}
    for stack in state.get("stacks") or ():
        if isinstance(stack, dict) and stack.get("main"):
            for frame in stack.get("frames") or ():
                if isinstance(frame, dict) and not frame.get("internal") and not frame.get("library"):
                    found[(frame.get("file"), frame.get("line"))] = None
    for record in list(state.get("inflight") or ()) + list(state.get("recent") or ()):
        for site in (record.get("site"), (record.get("region") or {}).get("site")):
            if isinstance(site, dict) and not record.get("p2p"):
                found[(site.get("file"), site.get("line"))] = None
    return [(f, n) for f, n in found if isinstance(f, str) and isinstance(n, int) and not f.startswith("<")]


def code_of_state(state: dict, user_file=None) -> dict:
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
