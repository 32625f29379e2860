"""The scopes and classes of one module for `ddpwatch lint`, which names hold a DDP-wrapped model, what a call runs."""

from __future__ import annotations

import ast

from .rankcond import collect_rank_names, dotted_name, function_rank_names, module_rank_names, scope_nodes
from .lint_index import ModuleIndex
from .lint_model import FUNCTIONS, ClassInfo, Scope, bindings, param_names
from .lint_ranks import per_rank_names
from .lint_walker import ScopeWalker

_WRAPPER_PASSTHROUGH = frozenset(
    {"to", "cuda", "cpu", "float", "half", "bfloat16", "double", "train", "eval", "requires_grad_", "type"}
)  # DDP methods that return the wrapper


class ModuleScopes:
    """The module body and every function in it as scopes (rank names, per-rank names, the wrapped model each name
    holds line by line, and the calls the walker found with the rank conditions and loops around them)."""

    def __init__(self, tree: ast.Module, index: ModuleIndex, lines: list[str]):
        self.index = index
        self.rank_names: set[str] = set()
        self.classes: dict[str, ClassInfo] = {}
        self.module_scope = Scope(tree, tree.body, is_function=False)
        self.scopes: list[Scope] = []
        self.scope_of: dict[int, Scope] = {}
        self._build(tree, lines)

    # -- building ----------------------------------------------------------------------------------------------

    def _build(self, tree: ast.Module, lines: list[str]) -> None:
        self.module_scope.nodes = scope_nodes(tree.body)
        self.scopes.append(self.module_scope)
        self._add_function_scopes(self.module_scope.nodes, None)
        self.rank_names = module_rank_names(tree, [scope.nodes for scope in self.scopes[1:]])
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
            ScopeWalker(lines, scope).walk()

    def _add_function_scopes(self, nodes: list[ast.AST], cls: ClassInfo | None, parent: ast.AST | None = None) -> None:
        """Register every function under `nodes` (one scope's nodes, or a class body's) as a scope."""
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                info = ClassInfo(node, {}, set(), [b for b in (dotted_name(x) for x in node.bases) if b])
                info.methods = {s.name: s for s in node.body if isinstance(s, FUNCTIONS)}
                self.classes.setdefault(node.name, info)
                self._add_function_scopes(scope_nodes(node.body), info, parent)
            elif isinstance(node, FUNCTIONS):
                is_method = (
                    cls is not None
                    and any(node is s for s in cls.node.body)
                    and not any(dotted_name(d) == "staticmethod" for d in node.decorator_list)
                )
                params = param_names(node)
                scope = Scope(
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

    def _prepare_scope(self, scope: Scope, rank_names: set[str], per_rank: set[str]) -> None:
        if isinstance(scope.node, FUNCTIONS):
            scope.rank_names = function_rank_names(scope.node, rank_names, nodes=scope.nodes)
        else:
            scope.rank_names = collect_rank_names(scope.body, rank_names, nodes=scope.nodes)
        scope.per_rank_names = per_rank_names(scope, per_rank)
        scope.timeline = self._wrapped_timeline(scope)
        scope.nested = {s.name: s for s in scope.nodes if isinstance(s, FUNCTIONS)}

    def _collect_wrapped_attrs(self, cls: ClassInfo) -> None:
        """`self.encoder = DistributedDataParallel(...)` in any method makes `self.encoder` wrapped class-wide."""
        for method in cls.methods.values():
            params = param_names(method)
            if not params:
                continue
            scope = self.scope_of[id(method)]
            for target, value, line in bindings(scope.nodes):
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == params[0]
                    and value is not None
                    and self._wraps(value, scope, line)
                ):
                    cls.wrapped_attrs.add(target.attr)

    def _class_chain(self, cls: ClassInfo | None) -> list[ClassInfo]:
        """The class and its bases defined in this module, nearest first."""
        chain: list[ClassInfo] = []
        pending = [cls] if cls else []
        while pending:
            current = pending.pop(0)
            if any(current is seen for seen in chain):
                continue
            chain.append(current)
            pending.extend(self.classes[b.split(".")[-1]] for b in current.bases if b.split(".")[-1] in self.classes)
        return chain

    # -- DDP-wrapped models ----------------------------------------------------------------------------------

    def _wraps(self, value: ast.AST, scope: Scope, line: int) -> bool:
        """Whether assigning `value` binds a DDP wrapper: `DDP(m)`, `DDP(m).cuda()`, `DDP(m) if d else m`, alias."""
        if self.index.is_ddp_construction(value):
            return True
        if isinstance(value, ast.IfExp):
            branches = [b for b in (value.body, value.orelse) if id(b) not in self.index.unwrapped_only]
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

    def _wrapped_timeline(self, scope: Scope) -> dict[str, list[tuple[int, bool]]]:
        """For each local name, its bindings in line order, each marked wrapped or not."""
        timeline: dict[str, list[tuple[int, bool]]] = {}
        scope.timeline = timeline  # filled as we go, so that `net = model` sees `model = DDP(...)` above it
        for target, value, line in sorted(bindings(scope.nodes), key=lambda b: b[2]):
            if isinstance(target, ast.Name):
                wrapped = value is not None and self._wraps(value, scope, line)
                timeline.setdefault(target.id, []).append((line, wrapped))
        return timeline

    def _name_is_wrapped(self, scope: Scope, name: str, line: int, bound: frozenset[str]) -> bool:
        history = scope.timeline.get(name, [])
        earlier = [wrapped for binding_line, wrapped in history if binding_line < line]
        if earlier:
            return earlier[-1]
        if name in scope.params:
            return name in bound
        if history and scope.is_function:
            return False  # a local bound only later
        if scope is self.module_scope:
            return False
        module = self.module_scope.timeline.get(name, [])
        return bool(module) and module[-1][1]

    def wrapped_target(
        self, scope: Scope, call: ast.Call, bound: frozenset[str] = frozenset(), cls: ClassInfo | None = None
    ) -> str | None:
        """The wrapped model a call runs DDP's forward on (`model(x)`, `self.encoder.forward(x)`), or None."""
        if id(call) in self.index.unwrapped_only:
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

    # -- the function a call runs ----------------------------------------------------------------------------

    def resolve_callee(self, scope: Scope, call: ast.Call) -> tuple[Scope, dict[str, str], str] | None:
        """The function a call runs, if it is defined in this module, with its parameters that receive a
        wrapped model (parameter -> the caller's name for it) and its name."""
        func = call.func
        definition = None
        skip_first = False
        if isinstance(func, ast.Name):
            definition = scope.nested.get(func.id) or self.index.functions.get(func.id)
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
        return callee, self._bound_wrapped_params(scope, call, definition, skip_first), definition.name

    def _bound_wrapped_params(
        self, scope: Scope, call: ast.Call, definition: ast.FunctionDef | ast.AsyncFunctionDef, skip_first: bool
    ) -> dict[str, str]:
        """Parameters of the callee (`definition`) that receive a wrapped model at this call: `evaluate(model)`."""
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
