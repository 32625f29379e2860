"""What differs between ranks in one scope, for `ddpwatch lint`: sizes and trip counts, and the other ranks' branch."""

from __future__ import annotations

import ast

from .rankcond import is_rank_condition, is_rank_expr
from .lint_model import Guard, Scope, bindings, nodes_in

_PER_RANK_WRAPPERS = frozenset(
    {"range", "len", "enumerate", "zip", "list", "tuple", "sorted", "reversed", "iter", "tqdm", "min", "max", "islice"}
)

# -- rank-dependent trip counts --------------------------------------------------------------------------------


def per_rank_names(scope: Scope, inherited: set[str]) -> set[str]:
    """The names of `scope` bound to a value whose size may differ between ranks (with those it inherits)."""
    names = set(inherited)
    pairs = [(t.id, v) for t, v, _ in bindings(scope.nodes) if isinstance(t, ast.Name) and v is not None]
    changed = True
    while changed:
        changed = False
        for name, value in pairs:
            if name not in names and is_per_rank(value, scope.rank_names, names):
                names.add(name)
                changed = True
    return names


def is_per_rank(expr: ast.AST, rank_names: set[str], per_rank: set[str]) -> bool:
    """Whether a value's size may differ between ranks: `data[rank]`, `range(rank)`, `shard[rank::n]`."""
    if is_rank_expr(expr, rank_names):
        return True
    if isinstance(expr, ast.Name):
        return expr.id in per_rank
    if isinstance(expr, ast.Subscript):
        return _is_per_rank_index(expr.slice, rank_names, per_rank) or is_per_rank(expr.value, rank_names, per_rank)
    if isinstance(expr, ast.BinOp):
        return is_per_rank(expr.left, rank_names, per_rank) or is_per_rank(expr.right, rank_names, per_rank)
    if isinstance(expr, ast.Call):
        name = expr.func.id if isinstance(expr.func, ast.Name) else getattr(expr.func, "attr", None)
        if name == "range":
            return _is_per_rank_range(expr.args, rank_names, per_rank)
        if name in _PER_RANK_WRAPPERS:
            return any(is_per_rank(arg, rank_names, per_rank) for arg in expr.args)
    return False


def mentions_rank(expr: ast.AST | None, rank_names: set[str], per_rank: set[str]) -> bool:
    """Whether `expr` reads the rank, or a name bound to a per-rank value, anywhere inside it."""
    if expr is None:
        return False
    return any(
        is_rank_expr(node, rank_names) or (isinstance(node, ast.Name) and node.id in per_rank)
        for node in nodes_in([expr])
    )


def _is_per_rank_index(index: ast.AST, rank_names: set[str], per_rank: set[str]) -> bool:
    """`x[rank]` and `x[rank::n]` vary in size by rank; `x[rank*k:(rank+1)*k]` is a fixed-size window."""
    if isinstance(index, ast.Slice):
        lower = mentions_rank(index.lower, rank_names, per_rank)
        upper = mentions_rank(index.upper, rank_names, per_rank)
        step = mentions_rank(index.step, rank_names, per_rank)
        return step or lower != upper
    return mentions_rank(index, rank_names, per_rank)


def _is_per_rank_range(args: list[ast.expr], rank_names: set[str], per_rank: set[str]) -> bool:
    """`range(rank)`, `range(rank, n, k)`: yes; `range(2*rank, 2*rank + 2)`: a fixed count, no."""
    flags = [mentions_rank(arg, rank_names, per_rank) for arg in args]
    if len(flags) == 1:
        return flags[0]
    if len(flags) >= 2:
        return flags[0] != flags[1] or any(flags[2:])
    return False


# -- what the other ranks do instead ---------------------------------------------------------------------------


def other_branches(guard: Guard, rank_names: set[str], elif_parent: dict[int, ast.If]) -> list[ast.stmt]:
    """What the other ranks run instead of the guarded branch: the rest of an if/elif/else chain on ranks
    (`elif_parent`: an elif's If -> the If above it).

    Empty for early exits and rank-conditional while loops, which have no alternative branch.
    """
    if guard.kind not in ("if", "else") or not isinstance(guard.node, ast.If):
        return []
    own = guard.node.body if guard.kind == "if" else guard.node.orelse
    root = guard.node
    while id(root) in elif_parent and is_rank_condition(elif_parent[id(root)].test, rank_names):
        root = elif_parent[id(root)]
    others: list[ast.stmt] = []
    node = root
    while True:
        if node.body is not own:
            others.extend(node.body)
        rest = node.orelse
        if len(rest) == 1 and isinstance(rest[0], ast.If) and is_rank_condition(rest[0].test, rank_names):
            node = rest[0]
            continue
        if rest is not own:
            others.extend(rest)
        return others
