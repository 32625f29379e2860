"""`ddpwatch lint`'s checks DDP001-DDP004 over one parsed module, read through its index and its scopes."""

from __future__ import annotations

import ast

from .rankcond import dotted_name
from .lint_index import ModuleIndex, targets_subgroup
from .lint_model import EarlyExit, Guard, LintFinding, Scope, Site, calls_in, nodes_in
from .lint_ranks import other_branches
from .lint_scopes import ModuleScopes
from .lint_walker import header_line

_SUBSET_GUARDS = frozenset({"if", "else", "early_exit", "while"})


def _same_callee(call: ast.Call, other: ast.Call) -> bool:
    return ast.dump(call.func) == ast.dump(other.func)


class ModuleChecker:
    """Finds DDP001-DDP004 in one parsed module: the module's index (lint_index.py) says which calls are collectives
    and which names DDP, its scopes (lint_scopes.py) where each call runs and which model it runs."""

    def __init__(self, tree: ast.Module, source: str, path: str):
        self.source = source
        self.lines = source.splitlines()
        self.path = path
        self.findings: dict[tuple[int, int, str], LintFinding] = {}
        self.index = ModuleIndex(tree)
        self.scopes = ModuleScopes(tree, self.index, self.lines)

    def _call_text(self, call: ast.Call) -> str:
        func = ast.get_source_segment(self.source, call.func) or dotted_name(call.func) or "call"
        return f"{func}()"

    # -- checks ------------------------------------------------------------------------------------------------

    def check(self) -> list[LintFinding]:
        for scope in self.scopes.scopes:
            paired = self._paired_collectives(scope)
            for site in scope.sites:
                self._check_wrapped_call(scope, site)
                self._check_collective(scope, site, paired)
                self._check_callee(scope, site)
            for early_exit in scope.exits:
                self._check_early_exit(scope, early_exit)
        return sorted(self.findings.values())

    def _report(self, node: ast.stmt | ast.expr, code: str, message: str, hint: str) -> None:
        key = (node.lineno, node.col_offset + 1, code)
        if key not in self.findings:  # the first (most direct) explanation wins
            self.findings[key] = LintFinding(self.path, node.lineno, node.col_offset + 1, code, message, hint)

    # -- what the other ranks do instead -----------------------------------------------------------------------

    def _other_branches(self, scope: Scope, guard: Guard) -> list[ast.stmt]:
        """What the other ranks run instead of the guarded branch (lint_ranks.other_branches)."""
        return other_branches(guard, scope.rank_names, self.index.elif_parent)

    def _models_run_by(self, scope: Scope, stmts: list[ast.stmt]) -> set[str]:
        """The DDP-wrapped models (as `scope` names them) that `stmts` run, directly or one call away."""
        models = set()
        for call in calls_in(stmts):
            direct = self.scopes.wrapped_target(scope, call)
            if direct is not None:
                models.add(direct)
            models.update(caller_side for _, _, caller_side in self._callee_wrapped_calls(scope, call))
        return models

    def _collectives_run_by(self, scope: Scope, stmts: list[ast.stmt]) -> set[str]:
        """The collectives `stmts` issue, directly or one call away."""
        names = set()
        for call in calls_in(stmts):
            name = self.index.collective_name(call)
            if name is not None:
                names.add(name)
            names.update(name for _, name in self._callee_collectives(scope, call))
        return names

    # -- DDP001 and DDP002, direct -------------------------------------------------------------------------------

    def _check_wrapped_call(self, scope: Scope, site: Site) -> None:
        """DDP001, direct: `if rank == 0: model(x)`."""
        if site.guard is None or site.guard.kind not in _SUBSET_GUARDS:
            return
        model = self.scopes.wrapped_target(scope, site.call)
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

    def _check_collective(self, scope: Scope, site: Site, paired: set[str]) -> None:
        """DDP002 (collective under a rank condition) and DDP004 (collective in a per-rank loop)."""
        name = self.index.collective_name(site.call)
        if name is None or targets_subgroup(site.call, name):
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
                f"(`{header_line(self.lines, loop)}` at line {loop.lineno}); ranks issue it a different "
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

    def _paired_collectives(self, scope: Scope) -> set[str]:
        """Collectives issued under two different rank conditions in one function, assumed to pair up.

        The idiom `if local_rank not in [-1, 0]: barrier()` ... `if local_rank == 0: barrier()` lets rank 0
        do some work first; each rank calls the barrier once, under complementary conditions. So does
        `if rank != 0: barrier(); return` followed by `barrier()` for the ranks that stayed.
        """
        tests: dict[str, set[str]] = {}
        for site in scope.sites:
            name = self.index.collective_name(site.call)
            if name and site.guard is not None and site.guard.kind in ("if", "else", "early_exit"):
                tests.setdefault(name, set()).add(ast.dump(site.guard.node.test) + site.guard.kind)
        return {name for name, conditions in tests.items() if len(conditions) >= 2}

    # -- one call away -------------------------------------------------------------------------------------------

    def _check_callee(self, scope: Scope, site: Site) -> None:
        """DDP001/DDP002 one call away: `if rank == 0: self.validation()` where validation() runs the model."""
        guard = site.guard
        if guard is None or guard.kind not in _SUBSET_GUARDS:
            return
        resolved = self.scopes.resolve_callee(scope, site.call)
        if resolved is None:
            return
        others = self._other_branches(scope, guard)
        if any(_same_callee(call, site.call) for call in calls_in(others)):
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

    def _callee_wrapped_calls(self, scope: Scope, call: ast.Call) -> list[tuple[ast.Call, str, str]]:
        """(call, model as the callee names it, model as the caller names it) for each DDP-wrapped model the
        function called by `call` runs outside rank conditions of its own (those are checked directly)."""
        resolved = self.scopes.resolve_callee(scope, call)
        if resolved is None:
            return []
        callee, binding, _ = resolved
        found = []
        for inner in callee.sites:
            if inner.guard is not None:
                continue
            model = self.scopes.wrapped_target(callee, inner.call, frozenset(binding), scope.cls)
            if model is None:
                continue
            caller_side = binding.get(model, model)
            if callee.self_name and scope.self_name and model.startswith(callee.self_name + "."):
                caller_side = scope.self_name + model[len(callee.self_name) :]
            found.append((inner.call, model, caller_side))
        return found

    def _callee_collectives(self, scope: Scope, call: ast.Call) -> list[tuple[ast.Call, str]]:
        """(call, collective) for each collective the function called by `call` issues outside rank conditions."""
        resolved = self.scopes.resolve_callee(scope, call)
        if resolved is None:
            return []
        found = []
        for inner in resolved[0].sites:
            name = self.index.collective_name(inner.call)
            if inner.guard is None and name is not None and not targets_subgroup(inner.call, name):
                found.append((inner.call, name))
        return found

    # -- DDP003 ----------------------------------------------------------------------------------------------------

    def _check_early_exit(self, scope: Scope, early_exit: EarlyExit) -> None:
        """DDP003: `if rank != 0: return` and a collective later that the returning ranks never reach."""
        balanced = self._collectives_run_by(scope, early_exit.branch)  # `if rank != 0: barrier(); return`
        inside_if = {id(node) for node in nodes_in([early_exit.if_node])}
        candidates = []
        for call in calls_in(early_exit.skipped):
            name = self.index.collective_name(call)
            if name and name not in balanced and id(call) not in inside_if and not targets_subgroup(call, name):
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
            f"`{word}` under `{header_line(self.lines, early_exit.if_node)}` (line "
            f"{early_exit.if_node.lineno}) skips `{text}` at line {call.lineno} on those ranks; "
            "the ranks that reach it wait forever",
            f"let every rank reach `{text}`: guard only the rank-local work instead of using `{word}`",
        )
