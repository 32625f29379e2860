"""What encloses a line of the user's source: its loops with their exits (and the `if` over each), the try around it."""

# Read when an incident is taken, kept in each rank's state as `code`: the analysis tells a rank that left a loop by a
# `break`/`return`, skipped part of an iteration by a `continue` or caught an exception from one whose data ran out,
# without reading a file itself.

from __future__ import annotations

import ast
import io
import os
import tokenize
from typing import Any, Mapping, NamedTuple, Union

from .rankcond import dotted_name, function_rank_names, is_rank_condition, module_rank_names, scope_nodes
from .source import parsed_file

__all__ = ["code_around", "code_around_source", "code_of_state"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_TRIES = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)
_BLOCKS = tuple(t for t in (ast.stmt, ast.ExceptHandler, getattr(ast, "match_case", None)) if t is not None)
_Loop = Union[ast.For, ast.AsyncFor, ast.While]
_Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]
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


def _exits_of(loop: _Loop, scope: "_Scope") -> list:
    """The loop's exits: breaks and continues aimed at it, returns anywhere in it (nested functions excluded), each
    with the innermost `if` over it and the `except` it sits in, inside the loop."""
    return _exits_in(loop.body, scope, in_loop=True)


def _exits_in(body: list, scope: "_Scope", in_loop: bool) -> list:
    """The exits of a block: with `in_loop`, its breaks and continues (outside nested loops) and every return; else
    its returns only (a function's body). Each with the innermost `if` over it and the `except` it sits in."""
    found: list = []

    def visit(node, nested_loop: bool, condition, handler) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES) or not isinstance(child, _BLOCKS):
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
                visit(child, nested_loop or isinstance(child, _LOOPS), condition, inner_handler)

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


def _endless(loop: _Loop) -> bool:
    """`while True:` (or `while 1:`), `for ... in itertools.count():`: it ends only by an exit."""
    if isinstance(loop, ast.While):
        return isinstance(loop.test, ast.Constant) and bool(loop.test.value) is True
    if not isinstance(loop.iter, ast.Call):
        return False
    name = dotted_name(loop.iter.func)
    return name is not None and name in ("count", "itertools.count")


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


class _Scope(NamedTuple):
    """Where the source is read: the parsed file, its lines, the function holding the line (None: the module) and
    the rank names in scope there."""

    tree: ast.Module
    lines: list
    function: _Function | None
    names: set


def _around(tree: ast.Module, lines: list, line: int) -> dict:
    chain = _chain(tree, line)
    functions = [n for n in chain if isinstance(n, _FUNCTIONS)]
    function = functions[-1] if functions else None
    inside = chain[chain.index(function) + 1 :] if function else chain
    scope = _Scope(tree, lines, function, _rank_names(tree, function))
    loops = [n for n in inside if isinstance(n, _LOOPS) and _in_block(n.body, line)]
    tries = [n for n in inside if isinstance(n, _TRIES) and _in_block(n.body, line)]
    span = [function.lineno, function.end_lineno or function.lineno] if function else [1, max(len(lines), 1)]
    return {
        "function": span,
        "loops": [
            {
                "line": loop.lineno,
                "end": loop.end_lineno or loop.lineno,
                "text": _header(lines, loop.lineno),
                "endless": _endless(loop),
                "counted": _counted(loop, scope),
                "exits": _exits_of(loop, scope),
            }
            for loop in reversed(loops)
        ][:MAX_LOOPS],
        "tries": [_try_doc(node, lines) for node in reversed(tries)][:MAX_LOOPS],
        "returns": _exits_in(function.body, scope, in_loop=False) if function else [],
    }


# ---------------------------------------------------------------- counted loops: as many iterations on every rank

_SAME_ITEMS = frozenset({"enumerate", "tqdm", "reversed", "list", "tuple", "iter", "sorted"})  # f(x): x's count
_NUMBER_CALLS = frozenset({"int", "min", "max", "abs", "round"})
MAX_DEPTH = 8  # calls, names and generators followed from a loop's header


def _counted(loop: _Loop, scope: _Scope) -> bool:
    """A `for` whose iterator yields as many items on every rank, so that it cannot run out on one rank first:
    `range()` (or `trange()`) over numbers no rank or data sets, `enumerate`/`tqdm`/`zip` over such, or a
    generator function of this file that yields once per iteration of such a loop."""
    return isinstance(loop, (ast.For, ast.AsyncFor)) and _counted_iter(loop.iter, scope, 0)


def _counted_iter(expr: ast.AST, scope: _Scope, depth: int) -> bool:
    if not isinstance(expr, ast.Call) or depth > MAX_DEPTH:
        return False
    name = dotted_name(expr.func) or ""
    last = name.split(".")[-1]
    if last in ("range", "trange"):
        return (
            bool(expr.args)
            and all(_fixed(a, scope, depth + 1) for a in expr.args)
            and (last == "trange" or not expr.keywords)
        )
    if last in _SAME_ITEMS:
        return bool(expr.args) and _counted_iter(expr.args[0], scope, depth + 1)
    if last == "zip":
        return bool(expr.args) and all(_counted_iter(a, scope, depth + 1) for a in expr.args)
    generator = _function_named(scope.tree, last) if last else None
    return generator is not None and _yields_counted(generator, scope, depth + 1)


def _function_named(tree: ast.Module, name: str) -> _Function | None:
    """The one function (or method) of the file with this name; None when there is none or more than one."""
    cached = _functions.get(id(tree))
    if cached is None or cached[0] is not tree:
        if len(_functions) > 64:
            _functions.clear()
        index: dict[str, list[_Function]] = {}
        for node in ast.walk(tree):
            if isinstance(node, _FUNCTIONS):
                index.setdefault(node.name, []).append(node)
        cached = _functions[id(tree)] = (tree, index)
    found = cached[1].get(name) or []
    return found[0] if len(found) == 1 else None


# id(tree) -> (tree, {name: [function nodes]}): the tree is kept, so its id names it
_functions: dict[int, tuple[ast.Module, dict[str, list[_Function]]]] = {}


def _yields_counted(function: _Function, scope: _Scope, depth: int) -> bool:
    """A generator whose one `yield` stands unconditionally in the body of a counted `for` at its top level, a loop
    that no break, continue or return leaves early, in a function with no return."""
    nodes = scope_nodes(function.body)
    yields = [n for n in nodes if isinstance(n, (ast.Yield, ast.YieldFrom))]
    if len(yields) != 1 or isinstance(yields[0], ast.YieldFrom) or any(isinstance(n, ast.Return) for n in nodes):
        return False
    inner = _Scope(scope.tree, scope.lines, function, _rank_names(scope.tree, function))
    for stmt in function.body:
        if (
            isinstance(stmt, (ast.For, ast.AsyncFor))
            and not stmt.orelse
            and any(isinstance(s, ast.Expr) and s.value is yields[0] for s in stmt.body)
        ):
            return not _leaves(stmt) and _counted_iter(stmt.iter, inner, depth)
    return False


def _leaves(loop: _Loop) -> bool:
    """Whether a break or continue aims at this loop (not at a loop nested in it)."""
    stack: list[ast.AST] = list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Break, ast.Continue)):
            return True
        if not isinstance(node, _LOOPS + _SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _fixed(expr: ast.AST, scope: _Scope, depth: int) -> bool:
    """A number that is the same on every rank: literals, arithmetic on them, names bound only to such numbers
    (UPPER_CASE names bound elsewhere count as constants), never a rank name, a length or any other call."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float))
    if isinstance(expr, ast.UnaryOp):
        return _fixed(expr.operand, scope, depth)
    if isinstance(expr, ast.BinOp):
        return _fixed(expr.left, scope, depth) and _fixed(expr.right, scope, depth)
    if isinstance(expr, ast.Call):
        return (
            isinstance(expr.func, ast.Name)
            and expr.func.id in _NUMBER_CALLS
            and not expr.keywords
            and bool(expr.args)
            and all(_fixed(a, scope, depth) for a in expr.args)
        )
    if isinstance(expr, ast.Attribute):
        return _constant_name(expr.attr) and dotted_name(expr) not in scope.names
    if isinstance(expr, ast.Name) and expr.id not in scope.names:
        values = _bound(expr.id, scope)
        if values is None:
            return _constant_name(expr.id)
        return bool(values) and all(v is not None and _fixed(v, scope, depth + 1) for v in values)
    return False


def _constant_name(name: str) -> bool:
    return name.isupper()


def _bound(name: str, scope: _Scope):
    """The values `name` is bound to in the function of `scope` (else the module): a list, with None for a binding
    that is not a plain assignment (a parameter, a loop variable, `+=`, an import...); None when it is bound
    nowhere in this file."""
    for body, function in (
        (scope.function.body, scope.function) if scope.function else (None, None),
        (scope.tree.body, None),
    ):
        if body is None:
            continue
        values = []
        if function is not None:
            args = function.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            values += [None for a in params if a is not None and a.arg == name]
        for node in scope_nodes(body):
            values += _bindings(node, name)
        if values:
            return values
    return None


def _bindings(node: ast.AST, name: str) -> list:
    if isinstance(node, ast.Assign):
        hits = [t for t in node.targets if isinstance(t, ast.Name) and t.id == name]
        unpacked = [
            t
            for t in node.targets
            if not isinstance(t, ast.Name) and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(t))
        ]
        return [node.value] * len(hits) + [None] * len(unpacked)
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
        return [node.value]
    if isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.NamedExpr)):
        targets = [getattr(node, "target", None)] + [
            getattr(i, "optional_vars", None) for i in getattr(node, "items", ())
        ]
        if any(t is not None and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(t)) for t in targets):
            return [None]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            return [None]
    if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
        return [None]
    return []


# ---------------------------------------------------------------- a condition that tests what a helper returned


def _decided_in(node: ast.If, branch: str, scope: _Scope) -> dict | None:
    """For `x = helper(...)` then `if x is None:` (or `not x`, `x == 0`...) over an exit: the one `return` of
    `helper` (a function of this file) whose constant value takes that branch, under a condition of its own. The
    decision was made there; the caller only passes it on."""
    tested = _tested_name(node.test)
    if tested is None or scope.function is None:
        return None
    calls = [value for line, value in _assigned_before(tested, node.lineno, scope)]
    if len(calls) != 1 or not isinstance(calls[0], ast.Call):
        return None
    helper = _function_named(scope.tree, (dotted_name(calls[0].func) or "").split(".")[-1])
    if helper is None or helper is scope.function:
        return None
    inner = _Scope(scope.tree, scope.lines, helper, _rank_names(scope.tree, helper))
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


def _assigned_before(name: str, line: int, scope: _Scope) -> list:
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
            if isinstance(site, dict) and not record.get("p2p"):
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
