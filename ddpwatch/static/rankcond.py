"""Recognise rank conditions, tests that only some ranks pass; shared by `ddpwatch lint` and the runtime report."""

from __future__ import annotations

import ast
import os
from typing import Iterable

from ..format import build
from .source import clear_cache, parsed_file

__all__ = [
    "DEFAULT_RANK_NAMES",
    "RANK_FUNCTIONS",
    "RANK_ENV_VARS",
    "dotted_name",
    "is_rank_expr",
    "is_rank_condition",
    "scope_nodes",
    "collect_rank_names",
    "function_rank_names",
    "module_rank_names",
    "rank_guarded_exit",
    "rank_only_decorator",
    "rank_condition_at",
    "rank_condition_at_path",
    "clear_cache",
    "parsed_file",
    "rank_condition_of",
    "rank_condition_at_site",
    "capture_rank_conditions",
]

# Names that hold a rank or a "this is the main rank" flag: they match a bare name (`rank`) and an attribute
# tail (`args.local_rank`, `self.trainer.is_global_zero`).
DEFAULT_RANK_NAMES: frozenset[str] = frozenset(
    {
        # plain PyTorch, torchrun scripts, nanoGPT-style scripts
        "rank",
        "local_rank",
        "global_rank",
        "world_rank",
        "node_rank",
        "group_rank",
        "ddp_rank",
        "ddp_local_rank",
        "rank_id",
        "local_rank_id",
        # flags that mean "I am the main rank"
        "is_master",
        "is_main",
        "is_main_process",
        "is_local_main_process",
        "is_master_process",
        "master_process",
        "main_process",
        "is_rank_zero",
        "is_rank0",
        "is_chief",
        "is_local_master",
        # PyTorch Lightning, Hugging Face Accelerate / Trainer
        "is_global_zero",
        "process_index",
        "local_process_index",
    }
)

# Functions whose result is a rank, or a flag for one, whatever object they hang off.
RANK_FUNCTIONS: frozenset[str] = frozenset(
    {
        "get_rank",
        "get_local_rank",
        "get_global_rank",
        "get_node_local_rank",
        "get_group_rank",
        "is_main_process",
        "is_master",
        "is_main",
        "is_rank_zero",
        "is_rank_0",
        "is_local_main_process",
        "is_world_process_zero",
        "is_local_process_zero",
        "is_local_master",
        "get_ordinal",
        "is_master_ordinal",  # torch_xla
        "get_data_parallel_rank",
        "get_tensor_model_parallel_rank",
        "get_pipeline_model_parallel_rank",  # Megatron
    }
)

# Environment variables set per process by torchrun, SLURM, Open MPI and friends.
RANK_ENV_VARS: frozenset[str] = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "NODE_RANK",
        "GLOBAL_RANK",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "MV2_COMM_WORLD_RANK",
    }
)

# Decorators that run the function on some ranks only (Lightning's rank_zero_only, Accelerate's on_main_process...).
RANK_ONLY_DECORATORS: frozenset[str] = frozenset(
    {
        "rank_zero_only",
        "rank_zero_first",
        "on_main_process",
        "on_local_main_process",
        "on_process",
        "on_local_process",
        "on_last_process",
        "main_process_only",
        "master_only",
        "on_rank_0",
        "rank0_only",
    }
)

# Wrappers that keep a value rank-dependent: int(os.environ["RANK"]) is still the rank.
_VALUE_WRAPPERS = frozenset({"int", "str", "float", "bool", "abs"})

_EXITS = (ast.Return, ast.Continue, ast.Break)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def dotted_name(expr: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
        return ".".join(reversed(parts))
    return None


def _call_name(call: ast.Call) -> str | None:
    """The last name of the called thing: ``get_rank`` for ``dist.get_rank()``."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _string_constant(expr: ast.AST | None) -> str | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    return None


def _is_environ(expr: ast.AST) -> bool:
    name = dotted_name(expr)
    return name is not None and name.split(".")[-1] == "environ"


def _is_rank_env_lookup(sub: ast.Subscript) -> bool:
    """``os.environ["RANK"]``."""
    return _is_environ(sub.value) and _string_constant(sub.slice) in RANK_ENV_VARS


def _is_rank_call(call: ast.Call, rank_names: Iterable[str]) -> bool:
    name = _call_name(call)
    first = call.args[0] if call.args else None
    if name in RANK_FUNCTIONS:
        return True
    if name in _VALUE_WRAPPERS:
        return first is not None and is_rank_expr(first, rank_names)
    if name == "getattr" and len(call.args) >= 2:
        return _string_constant(call.args[1]) in DEFAULT_RANK_NAMES
    if name in ("get", "getenv"):
        # os.environ.get("RANK"), os.getenv("LOCAL_RANK"), cfg.get("local_rank")
        key = _string_constant(first)
        return key in RANK_ENV_VARS or key in DEFAULT_RANK_NAMES
    # hvd.rank(), self.is_master(), accelerator.process_index() ...
    return is_rank_expr(call.func, rank_names)


def is_rank_expr(expr: ast.AST, rank_names: Iterable[str] = DEFAULT_RANK_NAMES) -> bool:
    """Whether the value of ``expr`` depends on which rank evaluates it.

    Recognises rank names and aliases from ``rank_names``, attribute tails from ``DEFAULT_RANK_NAMES``
    (``args.local_rank``, ``self.rank``), rank functions (``dist.get_rank()``, ``is_main_process()``),
    environment lookups (``os.environ["RANK"]``, ``os.environ.get("LOCAL_RANK")``), and arithmetic,
    ``int()``/``str()`` wrappers, comparisons and conditional expressions built on them.

    Entries of ``rank_names`` without a dot match bare names; dotted entries (``"self.is_main"``) match that
    exact attribute path. Attribute tails match only ``DEFAULT_RANK_NAMES``, so a local alias ``r`` does not
    make ``obj.r`` a rank. Rank calls and environment lookups count whatever ``rank_names`` holds.
    """
    names = rank_names if isinstance(rank_names, (set, frozenset)) else frozenset(rank_names)
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, ast.Attribute):
        dotted = dotted_name(expr)
        if dotted is not None and dotted in names:
            return True
        return expr.attr in DEFAULT_RANK_NAMES
    if isinstance(expr, ast.Call):
        return _is_rank_call(expr, names)
    if isinstance(expr, ast.Subscript):
        return _is_rank_env_lookup(expr)
    if isinstance(expr, ast.BinOp):
        return is_rank_expr(expr.left, names) or is_rank_expr(expr.right, names)
    if isinstance(expr, ast.UnaryOp):
        return is_rank_expr(expr.operand, names)
    if isinstance(expr, (ast.Compare, ast.BoolOp)):
        return is_rank_condition(expr, names)
    if isinstance(expr, ast.IfExp):
        return is_rank_condition(expr.test, names) or is_rank_expr(expr.body, names) or is_rank_expr(expr.orelse, names)
    if isinstance(expr, ast.NamedExpr):
        return is_rank_expr(expr.value, names)
    return False


def _is_sentinel(expr: ast.AST) -> bool:
    """None or -1: the values scripts use for "not distributed", the same on every rank."""
    if isinstance(expr, ast.Constant):
        return expr.value is None
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return isinstance(expr.operand, ast.Constant) and expr.operand.value == 1
    if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
        return bool(expr.elts) and all(_is_sentinel(element) for element in expr.elts)
    return False


def _is_uniform_check(compare: ast.Compare, names: frozenset[str] | set[str]) -> bool:
    """``local_rank != -1``, ``rank is None``, ``local_rank >= 0``: "are we distributed?", not "which rank?"."""
    if len(compare.ops) != 1:
        return False
    left, op, right = compare.left, compare.ops[0], compare.comparators[0]
    other = right if is_rank_expr(left, names) else left
    if _is_sentinel(other) and isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In, ast.NotIn)):
        return True
    # rank >= 0 and rank > -1 hold on every rank of a distributed job
    if other is right and isinstance(right, ast.Constant) and not isinstance(right.value, bool):
        return isinstance(op, ast.GtE) and right.value == 0
    if other is right and _is_sentinel(right) and isinstance(op, ast.Gt):
        return True
    return False


def is_rank_condition(test: ast.expr, rank_names: Iterable[str] = DEFAULT_RANK_NAMES) -> bool:
    """Whether an ``if``/``while`` test is passed by some ranks and not by others.

    True for ``rank == 0``, ``dist.get_rank() != 0``, ``local_rank in [-1, 0]``, ``is_master``,
    ``not accelerator.is_main_process``, ``self.trainer.is_global_zero``, ``rank == 0 and epoch % 5 == 0``,
    ``not dist.is_initialized() or dist.get_rank() == 0`` and names aliased to such values.
    False for checks every rank answers alike: ``local_rank != -1``, ``rank is None``, ``world_size > 1``.
    """
    names = rank_names if isinstance(rank_names, (set, frozenset)) else frozenset(rank_names)
    if isinstance(test, ast.BoolOp):
        return any(is_rank_condition(value, names) for value in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return is_rank_condition(test.operand, names)
    if isinstance(test, ast.Compare):
        operands = [test.left, *test.comparators]
        if not any(is_rank_expr(operand, names) for operand in operands):
            return False
        return not _is_uniform_check(test, names)
    if isinstance(test, ast.NamedExpr):
        return is_rank_condition(test.value, names)
    return is_rank_expr(test, names)


def scope_nodes(body: Iterable[ast.AST]) -> list[ast.AST]:
    """Every node of a scope's statements, nested blocks included, nested functions/classes/lambdas not.

    Those run elsewhere (when called), so what they assign or call is not this scope's business.
    """
    nodes: list[ast.AST] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        nodes.append(node)
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return nodes


def _assignments(nodes: Iterable[ast.AST]) -> Iterable[tuple[ast.AST, ast.AST]]:
    """(target, value) pairs assigned by ``nodes``."""
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _pair_targets(target, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            yield node.target, node.value
        elif isinstance(node, ast.NamedExpr):
            yield node.target, node.value


def _pair_targets(target: ast.AST, value: ast.AST) -> Iterable[tuple[ast.AST, ast.AST]]:
    """Split ``a, b = x, y`` into (a, x), (b, y); other unpacking is not followed."""
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for sub_target, sub_value in zip(target.elts, value.elts):
                yield from _pair_targets(sub_target, sub_value)
        return
    yield target, value


def _target_key(target: ast.AST) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return dotted_name(target)
    return None


def collect_rank_names(
    body: list[ast.stmt], rank_names: Iterable[str] = DEFAULT_RANK_NAMES, *, nodes: list[ast.AST] | None = None
) -> set[str]:
    """``rank_names`` plus every name (or ``self.x`` path) assigned a rank-dependent value in ``body``.

    Follows chains (``r = dist.get_rank()`` then ``is_main = r == 0``) in any order; nested functions and
    classes are their own scopes and are not looked into. ``nodes`` may pass ``scope_nodes(body)`` when the
    caller already has it, to save walking the tree again.
    """
    names = set(rank_names)
    nodes = nodes if nodes is not None else scope_nodes(body)
    pairs = [(key, value) for target, value in _assignments(nodes) if (key := _target_key(target)) is not None]
    added: set[str] = set()
    changed = True
    while changed:
        changed = False
        for key, value in pairs:
            if key not in names and is_rank_expr(value, names):
                names.add(key)
                added.add(key)
                changed = True
    # `for rank in range(world_size):` makes `rank` a local loop variable, the same on every process
    return names - (_loop_variables(nodes) - added)


def function_rank_names(
    function: ast.FunctionDef | ast.AsyncFunctionDef, rank_names: Iterable[str], *, nodes: list[ast.AST] | None = None
) -> set[str]:
    """The rank names inside ``function``: the enclosing scope's, its own aliases, and parameters with a
    rank's name (``def train(rank, world_size)``) even where the enclosing scope reused that name."""
    args = function.args
    params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} & DEFAULT_RANK_NAMES
    return collect_rank_names(function.body, set(rank_names) | params, nodes=nodes)


def _loop_variables(nodes: Iterable[ast.AST]) -> set[str]:
    variables: set = set()
    for node in nodes:
        if isinstance(node, (ast.For, ast.AsyncFor)):
            variables.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
    return variables


def module_rank_names(tree: ast.Module, function_nodes: Iterable[list[ast.AST]] | None = None) -> set[str]:
    """Defaults, module-level aliases, and ``self.x`` attributes assigned a rank value in any function.

    ``function_nodes`` may pass ``scope_nodes(f.body)`` for every function ``f`` of the tree, if the caller
    has them already.
    """
    if function_nodes is None:
        function_nodes = [
            scope_nodes(node.body)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
    function_nodes = list(function_nodes)
    names = collect_rank_names(tree.body, DEFAULT_RANK_NAMES)
    # a second round only when the first found attributes: self.a = rank in one method, self.b = self.a == 0 in another
    for _ in range(2):
        before = len(names)
        for nodes in function_nodes:
            names |= {name for name in collect_rank_names([], names, nodes=nodes) if "." in name}
        if len(names) == before:
            break
    return names


def rank_guarded_exit(stmt: ast.stmt, rank_names: Iterable[str] = DEFAULT_RANK_NAMES) -> ast.stmt | None:
    """For ``if <rank condition>:`` whose body (or else branch) ends in return/continue/break, that exit.

    None when ``stmt`` is anything else, or when both branches exit (nothing after it runs at all).
    """
    if not isinstance(stmt, ast.If) or not is_rank_condition(stmt.test, rank_names):
        return None
    exits = [branch[-1] for branch in (stmt.body, stmt.orelse) if branch and isinstance(branch[-1], _EXITS)]
    return exits[0] if len(exits) == 1 else None


def rank_only_decorator(function: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.expr | None:
    """The decorator that makes ``function`` run on some ranks only (``@rank_zero_only``), or None."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = dotted_name(target)
        if name is not None and name.split(".")[-1] in RANK_ONLY_DECORATORS:
            return decorator
    return None


def _exit_applies(exit_stmt: ast.stmt, in_function: bool, in_loop: bool) -> bool:
    """A return leaves the function; continue/break only matter inside a loop of this scope."""
    if isinstance(exit_stmt, ast.Return):
        return in_function
    return in_loop


def _header_text(lines: list[str], node: ast.stmt | ast.expr) -> str:
    if 1 <= node.lineno <= len(lines):
        return lines[node.lineno - 1].strip()[:200]
    return ""


def _condition(lines: list[str], node: ast.stmt, kind: str) -> dict:
    return {"line": node.lineno, "text": _header_text(lines, node), "kind": kind}


def _contains(node: ast.stmt, line: int) -> bool:
    end = getattr(node, "end_lineno", None) or node.lineno
    return node.lineno <= line <= end


def _blocks_of(stmt: ast.stmt) -> list[tuple[list[ast.stmt], bool]]:
    """The statement lists inside a compound statement, each with whether it is a loop body."""
    blocks: list[tuple[list[ast.stmt], bool]] = []
    if isinstance(stmt, _LOOPS):
        blocks.append((stmt.body, True))
        blocks.append((stmt.orelse, False))
        return blocks
    for field in ("body", "orelse", "finalbody"):
        block = getattr(stmt, field, None)
        if isinstance(block, list):
            blocks.append((block, False))
    for handler in getattr(stmt, "handlers", ()) or ():
        blocks.append((handler.body, False))
    for case in getattr(stmt, "cases", ()) or ():
        blocks.append((case.body, False))
    return blocks


def _condition_in_block(
    block: list[ast.stmt],
    line: int,
    lines: list[str],
    names: set[str],
    in_function: bool,
    in_loop: bool,
    best: dict | None,
) -> dict | None:
    """Walk down to ``line`` through ``block``, keeping the innermost rank condition met on the way."""
    for stmt in block:
        if not _contains(stmt, line):
            exit_stmt = rank_guarded_exit(stmt, names) if stmt.lineno < line else None
            if exit_stmt is not None and _exit_applies(exit_stmt, in_function, in_loop):
                best = dict(_condition(lines, stmt, "early_exit"), exit_line=exit_stmt.lineno)
            continue
        return _condition_in_stmt(stmt, line, lines, names, in_function, in_loop, best)
    return best


def _condition_in_stmt(
    stmt: ast.stmt, line: int, lines: list[str], names: set[str], in_function: bool, in_loop: bool, best: dict | None
) -> dict | None:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if not stmt.body or line < stmt.body[0].lineno:
            return best  # decorators and the signature run where the def is
        # a function body runs wherever it is called, not under the condition around its def; a rank-only
        # decorator (`@rank_zero_only`) is a condition over the whole body
        decorator = rank_only_decorator(stmt)
        best = (
            None
            if decorator is None
            else {"line": decorator.lineno, "kind": "decorator", "text": _header_text(lines, decorator)}
        )
        return _condition_in_block(stmt.body, line, lines, function_rank_names(stmt, names), True, False, best)
    if isinstance(stmt, ast.ClassDef):
        return _condition_in_block(stmt.body, line, lines, names, False, False, best)
    if isinstance(stmt, (ast.If, ast.While)) and is_rank_condition(stmt.test, names):
        if any(_contains(s, line) for s in stmt.body):
            best = _condition(lines, stmt, "if" if isinstance(stmt, ast.If) else "while")
        elif isinstance(stmt, ast.If) and any(_contains(s, line) for s in stmt.orelse):
            best = _condition(lines, stmt, "else")
    for block, is_loop_body in _blocks_of(stmt):
        if any(_contains(s, line) for s in block):
            return _condition_in_block(block, line, lines, names, in_function, in_loop or is_loop_body, best)
    return best


def _condition_in_tree(tree: ast.Module, lines: list[str], line: int) -> dict | None:
    return _condition_in_block(tree.body, line, lines, module_rank_names(tree), False, False, None)


def rank_condition_at(source: str, line: int) -> dict | None:
    """The innermost rank condition deciding whether ``line`` of ``source`` runs, or None.

    Returns ``{"line": 12, "text": "if dist.get_rank() == 0:", "kind": "if"}`` where kind is ``"if"``
    (inside the body), ``"else"`` (inside the else/elif part of a rank ``if``), ``"while"`` (inside a loop
    whose test is a rank condition) or ``"early_exit"`` (after ``if local_rank != 0: return`` earlier in the
    same function, or ``continue``/``break`` earlier in the same loop body; adds ``"exit_line"``).
    "line" and "text" are those of the ``if``/``while`` header. Never raises: bad input gives None.
    """
    try:
        if isinstance(source, bytes):
            source = source.decode("utf-8", errors="replace")
        if not isinstance(source, str) or not isinstance(line, int) or isinstance(line, bool) or line < 1:
            return None
        tree = ast.parse(source)
        return _condition_in_tree(tree, source.splitlines(), line)
    except Exception:  # noqa: BLE001 - the runtime report calls this mid-crash; a guess must not become a second crash
        return None


def rank_condition_at_path(path: str, line: int) -> dict | None:
    """``rank_condition_at`` for the file at ``path``; None if it is missing, unreadable or unparsable."""
    try:
        if not isinstance(line, int) or isinstance(line, bool) or line < 1:
            return None
        tree, lines = parsed_file(os.fspath(path))
        if tree is None:
            return None
        return _condition_in_tree(tree, lines, line)
    except Exception:  # noqa: BLE001 - same reason as rank_condition_at
        return None


# ---------------------------------------------------------------- over rank states: is the line under a rank condition?


def rank_condition_of(state: dict) -> dict | None:
    """The innermost rank condition over the rank's main-thread user frames: {"frame", "condition"} or None.

    The seed's own line (`self.encoder(input)` in validation()) has no condition; its caller in train() does,
    so every user frame on the stack is tried, innermost first.
    """
    for stack in state.get("stacks") or ():
        if not stack.get("main"):
            continue
        for frame in reversed(stack.get("frames") or ()):
            if frame.get("internal"):
                continue
            condition = rank_condition_at_path(frame["file"], frame["line"])
            if condition:
                return {"frame": build.site(frame["file"], frame["line"], frame["function"]), "condition": condition}
    return None


def rank_condition_at_site(site: dict) -> dict | None:
    """The rank condition over one known line (a framework call's site): {"frame", "condition"} or None."""
    condition = rank_condition_at_path(site["file"], site["line"])
    return {"frame": dict(site), "condition": condition} if condition else None


def capture_rank_conditions(states: dict) -> dict:
    """{str(rank): {"frame", "condition"}} over the stack of each rank whose state carries no rank condition of its
    own, read from the sources now: the incident keeps it, so the analysis (and a reanalysis on a machine without
    the sources) reads only the incident. Ranks under no condition are left out."""
    captured = {}
    seen: dict = {}  # most ranks stand at the same lines: each distinct stack is looked up once
    for rank, state in sorted(states.items()):
        if not state or state.get("rank_condition"):
            continue
        key = _main_stack_key(state)
        if key not in seen:
            try:
                seen[key] = rank_condition_of(state)
            except Exception:  # noqa: BLE001 - a hint from sources that may be gone or odd: never lose the report
                seen[key] = None
        if seen[key]:
            captured[str(rank)] = {part: dict(value) for part, value in seen[key].items()}  # no dict shared by ranks
    return captured


def _main_stack_key(state: dict) -> tuple:
    """What rank_condition_of reads of a state: its main-thread frames' (file, line, function, internal), as reprs
    (a crafted rank file's frame may hold a list where a line number goes: a key must still hash)."""
    return tuple(
        repr((frame.get("file"), frame.get("line"), frame.get("function"), bool(frame.get("internal"))))
        for stack in state.get("stacks") or ()
        if isinstance(stack, dict) and stack.get("main")
        for frame in stack.get("frames") or ()
        if isinstance(frame, dict)
    )
