"""What `ddpwatch lint` reads of a whole module first: its torch.distributed and DDP names, its functions, its elifs."""

from __future__ import annotations

import ast

from .rankcond import dotted_name
from .lint_model import ACCELERATOR_COLLECTIVES, COLLECTIVES, FUNCTIONS

_DDP_CLASS = "DistributedDataParallel"


class ModuleIndex:
    """The module-wide facts the checks look up: the aliases of torch.distributed, its collectives imported by name
    and DistributedDataParallel; the module's functions; the elifs; the branches that never run on a DDP wrapper."""

    def __init__(self, tree: ast.Module):
        self.dist_modules = {"dist", "torch.distributed"}
        self.imported_collectives: dict[str, str] = {}
        self.ddp_names = {_DDP_CLASS, "DDP"}
        self.elif_parent: dict[int, ast.If] = {}  # an `elif` (an If alone in an else) -> the If above it
        self.unwrapped_only: set[int] = set()  # nodes in branches that never run for a DDP wrapper
        self._read(tree)
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {
            stmt.name: stmt for stmt in tree.body if isinstance(stmt, FUNCTIONS)
        }

    def _read(self, tree: ast.Module) -> None:
        """Read the imports (aliases of torch.distributed, its collectives, DistributedDataParallel), the elifs,
        and the branches that only run for unwrapped models."""
        branches = []
        for node in ast.walk(tree):
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

    def is_ddp_construction(self, value: ast.AST) -> bool:
        """`DistributedDataParallel(...)`, under any name the module gave it."""
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        if isinstance(func, ast.Name):
            return func.id in self.ddp_names
        return isinstance(func, ast.Attribute) and func.attr == _DDP_CLASS

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


def targets_subgroup(call: ast.Call, name: str) -> bool:
    """A collective on an explicit process group may rightly run on only that group's ranks."""
    for keyword in call.keywords:
        if keyword.arg in ("group", "process_group"):
            return not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None)
        if keyword.arg == "use_local_synchronization":
            return True
    position = COLLECTIVES.get(name)
    return position is not None and len(call.args) > position
