"""`ddpwatch lint`'s checks DDP001-DDP004 over one parsed module."""

from __future__ import annotations

import ast

from .rankcond import (
    collect_rank_names,
    dotted_name,
    function_rank_names,
    is_rank_condition,
    is_rank_expr,
    module_rank_names,
    scope_nodes,
)
from .lint_model import (
    _DDP_CLASS,
    _FUNCTIONS,
    _PER_RANK_WRAPPERS,
    _SUBSET_GUARDS,
    _WRAPPER_PASSTHROUGH,
    ACCELERATOR_COLLECTIVES,
    COLLECTIVES,
    LintFinding,
    _Class,
    _EarlyExit,
    _Guard,
    _Scope,
    _Site,
    _calls_in,
    _nodes_in,
    _params,
)
from .lint_walker import _same_callee, _header, _bindings, _ScopeWalker


class _ModuleChecker:
    """Finds DDP001-DDP004 in one parsed module."""

    def __init__(self, tree: ast.Module, source: str, path: str):
        self.tree = tree
        self.source = source
        self.lines = source.splitlines()
        self.path = path
        self.findings: dict[tuple[int, int, str], LintFinding] = {}
        self.dist_modules = {"dist", "torch.distributed"}
        self.imported_collectives: dict[str, str] = {}
        self.ddp_names = {_DDP_CLASS, "DDP"}
        self.elif_parent: dict[int, ast.If] = {}  # an `elif` (an If alone in an else) -> the If above it
        self.unwrapped_only: set[int] = set()  # nodes in branches that never run for a DDP wrapper
        self._index_tree()
        self.rank_names: set[str] = set()
        self.functions: dict[str, ast.AST] = {stmt.name: stmt for stmt in tree.body if isinstance(stmt, _FUNCTIONS)}
        self.classes: dict[str, _Class] = {}
        self.module_scope = _Scope(tree, tree.body, is_function=False)
        self.scopes: list[_Scope] = []
        self.scope_of: dict[int, _Scope] = {}
        self._build_scopes()

    # -- indexing --------------------------------------------------------------------------------------------

    def _index_tree(self) -> None:
        """Read the imports (aliases of torch.distributed, its collectives, DistributedDataParallel), the elifs,
        and the branches that only run for unwrapped models."""
        branches = []
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.If, ast.IfExp)):
                branches.append(node)
            if isinstance(node, ast.If) and len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
                self.elif_parent[id(node.orelse[0])] = node
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "torch.distributed" and alias.asname:
                        self.dist_modules.add(alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    local = alias.asname or alias.name
                    if node.module == "torch" and alias.name == "distributed":
                        self.dist_modules.add(local)
                    elif node.module.startswith("torch.distributed") and alias.name in COLLECTIVES:
                        self.imported_collectives[local] = alias.name
                    elif alias.name == _DDP_CLASS:
                        self.ddp_names.add(local)
        for node in branches:
            self._mark_unwrapped_branch(node)

    def _mark_unwrapped_branch(self, node: ast.If | ast.IfExp) -> None:
        """`m.module(x) if hasattr(m, "module") else m(x)`: the else part never runs on a DDP wrapper."""
        test, negated = node.test, False
        while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, negated = test.operand, not negated
        if not self._is_wrapper_test(test):
            return
        branch = node.body if negated else node.orelse
        for part in branch if isinstance(branch, list) else [branch]:
            self.unwrapped_only.update(id(n) for n in ast.walk(part))

    def _is_wrapper_test(self, test: ast.AST) -> bool:
        """`hasattr(m, "module")` or `isinstance(m, DistributedDataParallel)`: true exactly for a wrapper."""
        if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and len(test.args) == 2):
            return False
        kind = test.args[1]
        if test.func.id == "hasattr":
            return isinstance(kind, ast.Constant) and kind.value == "module"
        if test.func.id == "isinstance":
            classes = kind.elts if isinstance(kind, ast.Tuple) else [kind]
            return any(
                (isinstance(c, ast.Name) and c.id in self.ddp_names)
                or (isinstance(c, ast.Attribute) and c.attr == _DDP_CLASS)
                for c in classes
            )
        return False

    # -- scopes ----------------------------------------------------------------------------------------------

    def _build_scopes(self) -> None:
        self.module_scope.nodes = scope_nodes(self.tree.body)
        self.scopes.append(self.module_scope)
        self._add_function_scopes(self.module_scope.nodes, None)
        self.rank_names = module_rank_names(self.tree, [scope.nodes for scope in self.scopes[1:]])
        for scope in self.scopes:  # parents come before their nested functions
            parent = self.scope_of.get(id(scope.parent)) if scope.parent is not None else None
            inherited = parent or self.module_scope
            if scope is self.module_scope:
                self._prepare_scope(scope, self.rank_names, set())
            else:
                self._prepare_scope(scope, inherited.rank_names, inherited.per_rank_names)
        for cls in self.classes.values():
            self._collect_wrapped_attrs(cls)
        for scope in self.scopes:
            _ScopeWalker(self, scope).walk()

    def _add_function_scopes(self, nodes: list[ast.AST], cls: _Class | None, parent: ast.AST | None = None) -> None:
        """Register every function under `nodes` (one scope's nodes, or a class body's) as a scope."""
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                info = _Class(node, {}, set(), [b for b in (dotted_name(x) for x in node.bases) if b])
                info.methods = {s.name: s for s in node.body if isinstance(s, _FUNCTIONS)}
                self.classes.setdefault(node.name, info)
                self._add_function_scopes(scope_nodes(node.body), info, parent)
            elif isinstance(node, _FUNCTIONS):
                is_method = (
                    cls is not None
                    and any(node is s for s in cls.node.body)
                    and not any(dotted_name(d) == "staticmethod" for d in node.decorator_list)
                )
                params = _params(node)
                scope = _Scope(
                    node,
                    node.body,
                    is_function=True,
                    cls=cls if is_method else None,
                    self_name=params[0] if is_method and params else None,
                    params=params,
                    nodes=scope_nodes(node.body),
                    parent=parent,
                )
                self.scopes.append(scope)
                self.scope_of[id(node)] = scope
                self._add_function_scopes(scope.nodes, None, node)

    def _prepare_scope(self, scope: _Scope, rank_names: set[str], per_rank: set[str]) -> None:
        if isinstance(scope.node, _FUNCTIONS):
            scope.rank_names = function_rank_names(scope.node, rank_names, nodes=scope.nodes)
        else:
            scope.rank_names = collect_rank_names(scope.body, rank_names, nodes=scope.nodes)
        scope.per_rank_names = self._collect_per_rank_names(scope, per_rank)
        scope.timeline = self._wrapped_timeline(scope)
        scope.nested = {s.name: s for s in scope.nodes if isinstance(s, _FUNCTIONS)}

    def _collect_wrapped_attrs(self, cls: _Class) -> None:
        """`self.encoder = DistributedDataParallel(...)` in any method makes `self.encoder` wrapped class-wide."""
        for method in cls.methods.values():
            params = _params(method)
            if not params:
                continue
            scope = self.scope_of[id(method)]
            for target, value, line in _bindings(scope.nodes):
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == params[0]
                    and value is not None
                    and self._wraps(value, scope, line)
                ):
                    cls.wrapped_attrs.add(target.attr)

    def _class_chain(self, cls: _Class | None) -> list[_Class]:
        """The class and its bases defined in this module, nearest first."""
        chain: list[_Class] = []
        pending = [cls] if cls else []
        while pending:
            current = pending.pop(0)
            if any(current is seen for seen in chain):
                continue
            chain.append(current)
            pending.extend(self.classes[b.split(".")[-1]] for b in current.bases if b.split(".")[-1] in self.classes)
        return chain

    # -- DDP-wrapped models ----------------------------------------------------------------------------------

    def _is_ddp_construction(self, value: ast.AST) -> bool:
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        if isinstance(func, ast.Name):
            return func.id in self.ddp_names
        return isinstance(func, ast.Attribute) and func.attr == _DDP_CLASS

    def _wraps(self, value: ast.AST, scope: _Scope, line: int) -> bool:
        """Whether assigning `value` binds a DDP wrapper: `DDP(m)`, `DDP(m).cuda()`, `DDP(m) if d else m`, alias."""
        if self._is_ddp_construction(value):
            return True
        if isinstance(value, ast.IfExp):
            branches = [b for b in (value.body, value.orelse) if id(b) not in self.unwrapped_only]
            return any(self._wraps(branch, scope, line) for branch in branches)
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in _WRAPPER_PASSTHROUGH
        ):
            return self._wraps(value.func.value, scope, line)
        if isinstance(value, ast.Name):
            return self._name_is_wrapped(scope, value.id, line, frozenset())
        return False

    def _wrapped_timeline(self, scope: _Scope) -> dict[str, list[tuple[int, bool]]]:
        """For each local name, its bindings in line order, each marked wrapped or not."""
        timeline: dict[str, list[tuple[int, bool]]] = {}
        scope.timeline = timeline  # filled as we go, so that `net = model` sees `model = DDP(...)` above it
        for target, value, line in sorted(_bindings(scope.nodes), key=lambda b: b[2]):
            if isinstance(target, ast.Name):
                wrapped = value is not None and self._wraps(value, scope, line)
                timeline.setdefault(target.id, []).append((line, wrapped))
        return timeline

    def _name_is_wrapped(self, scope: _Scope, name: str, line: int, bound: frozenset[str]) -> bool:
        bindings = scope.timeline.get(name, [])
        earlier = [wrapped for binding_line, wrapped in bindings if binding_line < line]
        if earlier:
            return earlier[-1]
        if name in scope.params:
            return name in bound
        if bindings and scope.is_function:
            return False  # a local bound only later
        if scope is self.module_scope:
            return False
        module = self.module_scope.timeline.get(name, [])
        return bool(module) and module[-1][1]

    def _wrapped_target(
        self, scope: _Scope, call: ast.Call, bound: frozenset[str] = frozenset(), cls: _Class | None = None
    ) -> str | None:
        """The wrapped model a call runs DDP's forward on (`model(x)`, `self.encoder.forward(x)`), or None."""
        if id(call) in self.unwrapped_only:
            return None
        target = call.func
        if isinstance(target, ast.Attribute) and target.attr == "forward":
            target = target.value
        if isinstance(target, ast.Name):
            return target.id if self._name_is_wrapped(scope, target.id, call.lineno, bound) else None
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and scope.self_name is not None
            and target.value.id == scope.self_name
        ):
            classes = self._class_chain(cls or scope.cls)
            if any(target.attr in c.wrapped_attrs for c in classes):
                return f"{scope.self_name}.{target.attr}"
        return None

    # -- collectives -----------------------------------------------------------------------------------------

    def collective_name(self, call: ast.Call) -> str | None:
        """`barrier` for `dist.barrier()`, `torch.distributed.barrier()` or an imported `barrier()`."""
        func = call.func
        if isinstance(func, ast.Name):
            return self.imported_collectives.get(func.id)
        if not isinstance(func, ast.Attribute):
            return None
        base = dotted_name(func.value)
        if func.attr in COLLECTIVES and base in self.dist_modules:
            return func.attr
        if func.attr == "wait_for_everyone":
            return func.attr
        if func.attr in ACCELERATOR_COLLECTIVES and base and "accelerator" in base.split(".")[-1].lower():
            return f"accelerator.{func.attr}"
        return None

    @staticmethod
    def targets_subgroup(call: ast.Call, name: str) -> bool:
        """A collective on an explicit process group may rightly run on only that group's ranks."""
        for keyword in call.keywords:
            if keyword.arg in ("group", "process_group"):
                return not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None)
            if keyword.arg == "use_local_synchronization":
                return True
        position = COLLECTIVES.get(name)
        return position is not None and len(call.args) > position

    def _call_text(self, call: ast.Call) -> str:
        func = ast.get_source_segment(self.source, call.func) or dotted_name(call.func) or "call"
        return f"{func}()"

    # -- rank-dependent trip counts ----------------------------------------------------------------------------

    def _collect_per_rank_names(self, scope: _Scope, inherited: set[str]) -> set[str]:
        names = set(inherited)
        pairs = [(t.id, v) for t, v, _ in _bindings(scope.nodes) if isinstance(t, ast.Name) and v is not None]
        changed = True
        while changed:
            changed = False
            for name, value in pairs:
                if name not in names and self._is_per_rank(value, scope.rank_names, names):
                    names.add(name)
                    changed = True
        return names

    def _is_per_rank(self, expr: ast.AST, rank_names: set[str], per_rank: set[str]) -> bool:
        """Whether a value's size may differ between ranks: `data[rank]`, `range(rank)`, `shard[rank::n]`."""
        if is_rank_expr(expr, rank_names):
            return True
        if isinstance(expr, ast.Name):
            return expr.id in per_rank
        if isinstance(expr, ast.Subscript):
            return self._is_per_rank_index(expr.slice, rank_names, per_rank) or self._is_per_rank(
                expr.value, rank_names, per_rank
            )
        if isinstance(expr, ast.BinOp):
            return self._is_per_rank(expr.left, rank_names, per_rank) or self._is_per_rank(
                expr.right, rank_names, per_rank
            )
        if isinstance(expr, ast.Call):
            name = expr.func.id if isinstance(expr.func, ast.Name) else getattr(expr.func, "attr", None)
            if name == "range":
                return self._is_per_rank_range(expr.args, rank_names, per_rank)
            if name in _PER_RANK_WRAPPERS:
                return any(self._is_per_rank(arg, rank_names, per_rank) for arg in expr.args)
        return False

    def _mentions_rank(self, expr: ast.AST | None, rank_names: set[str], per_rank: set[str]) -> bool:
        if expr is None:
            return False
        return any(
            is_rank_expr(node, rank_names) or (isinstance(node, ast.Name) and node.id in per_rank)
            for node in _nodes_in([expr])
        )

    def _is_per_rank_index(self, index: ast.AST, rank_names: set[str], per_rank: set[str]) -> bool:
        """`x[rank]` and `x[rank::n]` vary in size by rank; `x[rank*k:(rank+1)*k]` is a fixed-size window."""
        if isinstance(index, ast.Slice):
            lower = self._mentions_rank(index.lower, rank_names, per_rank)
            upper = self._mentions_rank(index.upper, rank_names, per_rank)
            step = self._mentions_rank(index.step, rank_names, per_rank)
            return step or lower != upper
        return self._mentions_rank(index, rank_names, per_rank)

    def _is_per_rank_range(self, args: list[ast.expr], rank_names: set[str], per_rank: set[str]) -> bool:
        """`range(rank)`, `range(rank, n, k)`: yes; `range(2*rank, 2*rank + 2)`: a fixed count, no."""
        flags = [self._mentions_rank(arg, rank_names, per_rank) for arg in args]
        if len(flags) == 1:
            return flags[0]
        if len(flags) >= 2:
            return flags[0] != flags[1] or any(flags[2:])
        return False

    # -- checks ------------------------------------------------------------------------------------------------

    def check(self) -> list[LintFinding]:
        for scope in self.scopes:
            paired = self._paired_collectives(scope)
            for site in scope.sites:
                self._check_wrapped_call(scope, site)
                self._check_collective(scope, site, paired)
                self._check_callee(scope, site)
            for early_exit in scope.exits:
                self._check_early_exit(scope, early_exit)
        return sorted(self.findings.values())

    def _report(self, node: ast.AST, code: str, message: str, hint: str) -> None:
        key = (node.lineno, node.col_offset + 1, code)
        if key not in self.findings:  # the first (most direct) explanation wins
            self.findings[key] = LintFinding(self.path, node.lineno, node.col_offset + 1, code, message, hint)

    # -- what the other ranks do instead -----------------------------------------------------------------------

    def _other_branches(self, scope: _Scope, guard: _Guard) -> list[ast.stmt]:
        """What the other ranks run instead of the guarded branch: the rest of an if/elif/else chain on ranks.

        Empty for early exits and rank-conditional while loops, which have no alternative branch.
        """
        if guard.kind not in ("if", "else") or not isinstance(guard.node, ast.If):
            return []
        own = guard.node.body if guard.kind == "if" else guard.node.orelse
        names = scope.rank_names
        root = guard.node
        while id(root) in self.elif_parent and is_rank_condition(self.elif_parent[id(root)].test, names):
            root = self.elif_parent[id(root)]
        others: list[ast.stmt] = []
        node = root
        while True:
            if node.body is not own:
                others.extend(node.body)
            rest = node.orelse
            if len(rest) == 1 and isinstance(rest[0], ast.If) and is_rank_condition(rest[0].test, names):
                node = rest[0]
                continue
            if rest is not own:
                others.extend(rest)
            return others

    def _models_run_by(self, scope: _Scope, stmts: list[ast.stmt]) -> set[str]:
        """The DDP-wrapped models (as `scope` names them) that `stmts` run, directly or one call away."""
        models = set()
        for call in _calls_in(stmts):
            direct = self._wrapped_target(scope, call)
            if direct is not None:
                models.add(direct)
            models.update(caller_side for _, _, caller_side in self._callee_wrapped_calls(scope, call))
        return models

    def _collectives_run_by(self, scope: _Scope, stmts: list[ast.stmt]) -> set[str]:
        """The collectives `stmts` issue, directly or one call away."""
        names = set()
        for call in _calls_in(stmts):
            name = self.collective_name(call)
            if name is not None:
                names.add(name)
            names.update(name for _, name in self._callee_collectives(scope, call))
        return names

    # -- DDP001 and DDP002, direct -------------------------------------------------------------------------------

    def _check_wrapped_call(self, scope: _Scope, site: _Site) -> None:
        """DDP001, direct: `if rank == 0: model(x)`."""
        if site.guard is None or site.guard.kind not in _SUBSET_GUARDS:
            return
        model = self._wrapped_target(scope, site.call)
        if model is None or model in self._models_run_by(scope, self._other_branches(scope, site.guard)):
            return  # `if rank == 0: model(x, log=True) else: model(x)` runs the forward on every rank
        self._report_wrapped_call(site.call, model, site.guard.describe())

    def _report_wrapped_call(self, call: ast.Call, model: str, where: str) -> None:
        self._report(
            call,
            "DDP001",
            f"DDP-wrapped model `{model}` called on a subset of ranks ({where}); "
            "DistributedDataParallel.forward may broadcast buffers and hang",
            f"use `{model}.module(...)` for rank-local work: it runs the wrapped module without "
            "DistributedDataParallel's collectives",
        )

    def _check_collective(self, scope: _Scope, site: _Site, paired: set[str]) -> None:
        """DDP002 (collective under a rank condition) and DDP004 (collective in a per-rank loop)."""
        name = self.collective_name(site.call)
        if name is None or self.targets_subgroup(site.call, name):
            return
        guard = site.guard
        if (
            guard is not None
            and guard.kind in ("if", "else")
            and name not in paired
            and name not in self._collectives_run_by(scope, self._other_branches(scope, guard))
        ):
            self._report_subset_collective(site.call, guard.describe())
        per_rank_loops = [loop for loop in site.loops if loop.per_rank]
        if per_rank_loops:
            loop = per_rank_loops[-1].node
            text = self._call_text(site.call)
            self._report(
                site.call,
                "DDP004",
                f"collective `{text}` inside a loop whose trip count depends on the rank "
                f"(`{_header(self.lines, loop)}` at line {loop.lineno}); ranks issue it a different "
                "number of times and hang",
                "give every rank the same number of iterations (pad or split the work evenly), or "
                f"move `{text}` out of the loop",
            )

    def _report_subset_collective(self, call: ast.Call, where: str) -> None:
        text = self._call_text(call)
        self._report(
            call,
            "DDP002",
            f"collective `{text}` called on a subset of ranks ({where}); the other ranks never join it and it hangs",
            f"call `{text}` on every rank (move it out of the rank condition); for rank-local "
            "exchange use a subgroup or send/recv",
        )

    def _paired_collectives(self, scope: _Scope) -> set[str]:
        """Collectives issued under two different rank conditions in one function, assumed to pair up.

        The idiom `if local_rank not in [-1, 0]: barrier()` ... `if local_rank == 0: barrier()` lets rank 0
        do some work first; each rank calls the barrier once, under complementary conditions. So does
        `if rank != 0: barrier(); return` followed by `barrier()` for the ranks that stayed.
        """
        tests: dict[str, set[str]] = {}
        for site in scope.sites:
            name = self.collective_name(site.call)
            if name and site.guard is not None and site.guard.kind in ("if", "else", "early_exit"):
                tests.setdefault(name, set()).add(ast.dump(site.guard.node.test) + site.guard.kind)
        return {name for name, conditions in tests.items() if len(conditions) >= 2}

    # -- one call away -------------------------------------------------------------------------------------------

    def _check_callee(self, scope: _Scope, site: _Site) -> None:
        """DDP001/DDP002 one call away: `if rank == 0: self.validation()` where validation() runs the model."""
        guard = site.guard
        if guard is None or guard.kind not in _SUBSET_GUARDS:
            return
        resolved = self._resolve_callee(scope, site.call)
        if resolved is None:
            return
        others = self._other_branches(scope, guard)
        if any(_same_callee(call, site.call) for call in _calls_in(others)):
            return  # the other ranks call it too
        where = f"{resolved[2]}() is called {guard.describe(site.call.lineno)}"
        wrapped_calls = self._callee_wrapped_calls(scope, site.call)
        if wrapped_calls:
            other_models = self._models_run_by(scope, others)
            for inner, model, caller_side in wrapped_calls:
                if caller_side not in other_models:
                    self._report_wrapped_call(inner, model, where)
        if guard.kind == "while":
            return  # collectives in rank-dependent loops are DDP004's business
        collectives = self._callee_collectives(scope, site.call)
        if collectives:
            other_collectives = self._collectives_run_by(scope, others)
            for inner, name in collectives:
                if name not in other_collectives:
                    self._report_subset_collective(inner, where)

    def _callee_wrapped_calls(self, scope: _Scope, call: ast.Call) -> list[tuple[ast.Call, str, str]]:
        """(call, model as the callee names it, model as the caller names it) for each DDP-wrapped model the
        function called by `call` runs outside rank conditions of its own (those are checked directly)."""
        resolved = self._resolve_callee(scope, call)
        if resolved is None:
            return []
        callee, binding, _ = resolved
        found = []
        for inner in callee.sites:
            if inner.guard is not None:
                continue
            model = self._wrapped_target(callee, inner.call, frozenset(binding), scope.cls)
            if model is None:
                continue
            caller_side = binding.get(model, model)
            if callee.self_name and scope.self_name and model.startswith(callee.self_name + "."):
                caller_side = scope.self_name + model[len(callee.self_name) :]
            found.append((inner.call, model, caller_side))
        return found

    def _callee_collectives(self, scope: _Scope, call: ast.Call) -> list[tuple[ast.Call, str]]:
        """(call, collective) for each collective the function called by `call` issues outside rank conditions."""
        resolved = self._resolve_callee(scope, call)
        if resolved is None:
            return []
        found = []
        for inner in resolved[0].sites:
            name = self.collective_name(inner.call)
            if inner.guard is None and name is not None and not self.targets_subgroup(inner.call, name):
                found.append((inner.call, name))
        return found

    def _resolve_callee(self, scope: _Scope, call: ast.Call) -> tuple[_Scope, dict[str, str], str] | None:
        """The function a call runs, if it is defined in this module, with its parameters that receive a
        wrapped model (parameter -> the caller's name for it) and its name."""
        func = call.func
        definition = None
        skip_first = False
        if isinstance(func, ast.Name):
            definition = scope.nested.get(func.id) or self.functions.get(func.id)
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and scope.self_name is not None
            and func.value.id == scope.self_name
        ):
            for cls in self._class_chain(scope.cls):
                if func.attr in cls.methods:
                    definition = cls.methods[func.attr]
                    break
            skip_first = True
        if definition is None or definition is scope.node or id(definition) not in self.scope_of:
            return None
        callee = self.scope_of[id(definition)]
        return callee, self._bound_wrapped_params(scope, call, callee, skip_first), definition.name

    def _bound_wrapped_params(self, scope: _Scope, call: ast.Call, callee: _Scope, skip_first: bool) -> dict[str, str]:
        """Parameters of the callee that receive a wrapped model at this call: `evaluate(model)`."""
        definition = callee.node
        positional = [a.arg for a in (*definition.args.posonlyargs, *definition.args.args)]
        if skip_first:
            positional = positional[1:]
        bound: dict[str, str] = {}
        for param, arg in zip(positional, call.args):
            if isinstance(arg, ast.Starred):
                break
            if isinstance(arg, ast.Name) and self._name_is_wrapped(scope, arg.id, call.lineno, frozenset()):
                bound[param] = arg.id
        for keyword in call.keywords:
            value = keyword.value
            if (
                keyword.arg
                and isinstance(value, ast.Name)
                and self._name_is_wrapped(scope, value.id, call.lineno, frozenset())
            ):
                bound[keyword.arg] = value.id
        return bound

    # -- DDP003 ----------------------------------------------------------------------------------------------------

    def _check_early_exit(self, scope: _Scope, early_exit: _EarlyExit) -> None:
        """DDP003: `if rank != 0: return` and a collective later that the returning ranks never reach."""
        balanced = self._collectives_run_by(scope, early_exit.branch)  # `if rank != 0: barrier(); return`
        inside_if = {id(node) for node in _nodes_in([early_exit.if_node])}
        candidates = []
        for call in _calls_in(early_exit.skipped):
            name = self.collective_name(call)
            if name and name not in balanced and id(call) not in inside_if and not self.targets_subgroup(call, name):
                candidates.append(call)
        if not candidates:
            return
        after = [c for c in candidates if c.lineno > early_exit.exit.lineno]
        call = min(after or candidates, key=lambda c: (c.lineno, c.col_offset))
        word = type(early_exit.exit).__name__.lower()
        text = self._call_text(call)
        self._report(
            early_exit.exit,
            "DDP003",
            f"`{word}` under `{_header(self.lines, early_exit.if_node)}` (line "
            f"{early_exit.if_node.lineno}) skips `{text}` at line {call.lineno} on those ranks; "
            "the ranks that reach it wait forever",
            f"let every rank reach `{text}`: guard only the rank-local work instead of using `{word}`",
        )
