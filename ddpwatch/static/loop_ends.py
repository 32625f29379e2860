"""How a loop ends, read from its source: after as many iterations on every rank (`counted`: `range(10)`, a
generator over one), or only by an exit (`endless`: `while True:`, `itertools.cycle`, a generator that never returns).
With the scope a line is read in (its file, function and rank names), which static/exits.py builds."""

from __future__ import annotations

import ast
from typing import NamedTuple, Union

from .rankcond import dotted_name, function_rank_names, module_rank_names, scope_nodes

LOOPS = (ast.For, ast.AsyncFor, ast.While)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
Loop = Union[ast.For, ast.AsyncFor, ast.While]
Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]


def rank_names(tree: ast.Module, function) -> set:
    """The rank names in scope at `function` (the module's when None), computed once per tree and function."""
    key = (id(tree), id(function))
    cached = _names.get(key)
    if cached is None or cached[0] is not tree:
        if len(_names) > 256:
            _names.clear()
        names = module_rank_names(tree) if function is None else function_rank_names(function, rank_names(tree, None))
        cached = _names[key] = (tree, names)
    return cached[1]


_names: dict = {}  # (id(tree), id(function)) -> (tree, rank names): the tree is kept, so its ids name it


class Scope(NamedTuple):
    """Where the source is read: the parsed file, its lines, the function holding the line (None: the module) and
    the rank names in scope there."""

    tree: ast.Module
    lines: list
    function: Function | None
    names: set


# ---------------------------------------------------------------- counted loops: as many iterations on every rank

_SAME_ITEMS = frozenset({"enumerate", "tqdm", "reversed", "list", "tuple", "iter", "sorted"})  # f(x): x's count
_NUMBER_CALLS = frozenset({"int", "min", "max", "abs", "round"})
MAX_DEPTH = 8  # calls, names and generators followed from a loop's header


def counted(loop: Loop, scope: Scope) -> bool:
    """A `for` whose iterator yields as many items on every rank, so that it cannot run out on one rank first:
    `range()` (or `trange()`) over numbers no rank or data sets, `enumerate`/`tqdm`/`zip` over such, or a
    generator function of this file that yields once per iteration of such a loop."""
    return isinstance(loop, (ast.For, ast.AsyncFor)) and _counted_iter(loop.iter, scope, 0)


def _counted_iter(expr: ast.AST, scope: Scope, depth: int) -> bool:
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
    generator = function_named(scope.tree, last) if last else None
    return generator is not None and _yields_counted(generator, scope, depth + 1)


def function_named(tree: ast.Module, name: str) -> Function | None:
    """The one function (or method) of the file with this name; None when there is none or more than one."""
    cached = _functions.get(id(tree))
    if cached is None or cached[0] is not tree:
        if len(_functions) > 64:
            _functions.clear()
        index: dict[str, list[Function]] = {}
        for node in ast.walk(tree):
            if isinstance(node, FUNCTIONS):
                index.setdefault(node.name, []).append(node)
        cached = _functions[id(tree)] = (tree, index)
    found = cached[1].get(name) or []
    return found[0] if len(found) == 1 else None


# id(tree) -> (tree, {name: [function nodes]}): the tree is kept, so its id names it
_functions: dict[int, tuple[ast.Module, dict[str, list[Function]]]] = {}


def _yields_counted(function: Function, scope: Scope, depth: int) -> bool:
    """A generator whose one `yield` stands unconditionally in the body of a counted `for` at its top level, a loop
    that no break, continue or return leaves early, in a function with no return."""
    nodes = scope_nodes(function.body)
    yields = [n for n in nodes if isinstance(n, (ast.Yield, ast.YieldFrom))]
    if len(yields) != 1 or isinstance(yields[0], ast.YieldFrom) or any(isinstance(n, ast.Return) for n in nodes):
        return False
    inner = Scope(scope.tree, scope.lines, function, rank_names(scope.tree, function))
    for stmt in function.body:
        if (
            isinstance(stmt, (ast.For, ast.AsyncFor))
            and not stmt.orelse
            and any(isinstance(s, ast.Expr) and s.value is yields[0] for s in stmt.body)
        ):
            return not _leaves(stmt) and _counted_iter(stmt.iter, inner, depth)
    return False


def _leaves(loop: Loop) -> bool:
    """Whether a break or continue aims at this loop (not at a loop nested in it)."""
    stack: list[ast.AST] = list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Break, ast.Continue)):
            return True
        if not isinstance(node, LOOPS + SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _fixed(expr: ast.AST, scope: Scope, depth: int) -> bool:
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


def _bound(name: str, scope: Scope):
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


# ---------------------------------------------------------------- endless loops: they end only by an exit


def endless(loop: Loop, scope: Scope) -> bool:
    """A loop that ends only by an exit: `while True:` (or `while 1:`), or a `for` over an iterator that never runs
    out: `itertools.count()`, `itertools.cycle(x)`, `itertools.repeat(x)` without a count, or a generator function of
    this file whose yields stand in a `while True:` at its top level that nothing leaves (`def stream(shard): while
    True: yield from shard`)."""
    if isinstance(loop, ast.While):
        return _always_true(loop.test)
    return _endless_iter(loop.iter, scope, 0)


def _always_true(test: ast.AST) -> bool:
    return isinstance(test, ast.Constant) and bool(test.value) is True


def _endless_iter(expr: ast.AST, scope: Scope, depth: int) -> bool:
    if not isinstance(expr, ast.Call) or depth > MAX_DEPTH:
        return False
    name = dotted_name(expr.func) or ""
    last = name.split(".")[-1]
    if last in ("count", "cycle") and name in (last, f"itertools.{last}"):
        return True
    if last == "repeat" and name in ("repeat", "itertools.repeat"):
        return len(expr.args) == 1 and not expr.keywords  # repeat(x, n) runs out after n
    if last in ("enumerate", "iter", "tqdm") and expr.args:
        return _endless_iter(expr.args[0], scope, depth + 1)  # as many items as what they wrap
    generator = function_named(scope.tree, last) if last else None
    return generator is not None and _yields_forever(generator)


def _yields_forever(function: Function) -> bool:
    """A generator with no `return`, whose every yield stands in one `while True:` of its top level that no break
    leaves: once started it never raises StopIteration."""
    nodes = scope_nodes(function.body)
    yields = [n for n in nodes if isinstance(n, (ast.Yield, ast.YieldFrom))]
    if not yields or any(isinstance(n, ast.Return) for n in nodes):
        return False
    for stmt in function.body:
        if isinstance(stmt, ast.While) and _always_true(stmt.test) and not _breaks(stmt):
            inside = {id(n) for n in ast.walk(stmt)}
            return all(id(y) in inside for y in yields)
    return False


def _breaks(loop: Loop) -> bool:
    """Whether a break aims at this loop (not at a loop nested in it)."""
    stack: list[ast.AST] = list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Break):
            return True
        if not isinstance(node, LOOPS + SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return False
