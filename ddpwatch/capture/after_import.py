"""Runs a function once a module is imported, without importing it (a meta-path finder while anything waits): a patch
on a module the program may never use must not cost its import (FSDP2's pulls in DTensor and sympy: 0.6 s of CPU
per rank). The one such finder: zero-code activation (bootstrap) waits here for torch.distributed at interpreter
start-up, the patches for the modules they wrap; so it imports only built-in modules (sys, _thread) at its top."""

from __future__ import annotations

import _thread
import sys

_logged: set = set()


def when_imported(name: str, then) -> AfterImport:
    """Call `then(module)` now if `name` is imported, else right after the program first imports it; cancel() stops
    it. A module another thread is importing at this moment is left alone (it is in sys.modules, half made)."""
    hook = AfterImport(name, then)
    module = sys.modules.get(name)
    if module is None:
        _FINDER.wait_for(hook)
    elif not getattr(getattr(module, "__spec__", None), "_initializing", False):
        hook.fire(module)
    return hook


class AfterImport:
    """One function waiting for one module, called at most once."""

    def __init__(self, name: str, then):
        self.name = name
        self._then = then
        self._lock = _thread.allocate_lock()
        self._done = False

    def fire(self, module) -> None:
        """`then(module)` once; its failure is logged and never reaches the program's import."""
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                self._then(module)
            except Exception:
                from ..logonce import log_once  # here: start-up imports no logging

                log_once(_logged, self.name, f"ddpwatch: could not patch {self.name}; it runs unpatched", exc_info=True)

    def cancel(self) -> None:
        """Never fire (a patch undone before the module was imported); a `then` running now finishes first."""
        with self._lock:
            self._done = True
        _FINDER.forget(self)


class _Finder:
    """Finds nothing itself: for a module someone waits for it asks the finders after it and wraps the loader they
    return. In sys.meta_path only while something waits; the list is replaced, never changed in place, because
    another thread's import may be iterating it."""

    def __init__(self):
        self._lock = _thread.allocate_lock()
        self._waiting: dict = {}  # module name -> [AfterImport]

    def wait_for(self, hook: AfterImport) -> None:
        with self._lock:
            self._waiting.setdefault(hook.name, []).append(hook)
            if self not in sys.meta_path:
                sys.meta_path = [self] + list(sys.meta_path)

    def forget(self, hook: AfterImport) -> None:
        with self._lock:
            hooks = self._waiting.get(hook.name, [])
            if hook in hooks:
                hooks.remove(hook)
            self._leave_if_idle()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._waiting:
            return None
        spec = self._spec_from_the_others(fullname, path, target)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module") or isinstance(loader, _ThenLoader):
            return spec  # a loader of the old protocol: imported as usual, and not patched
        spec.loader = _ThenLoader(loader, lambda module: self._imported(fullname, module))
        return spec

    def invalidate_caches(self) -> None:
        pass  # it caches nothing (importlib.invalidate_caches() asks every finder)

    def _spec_from_the_others(self, fullname, path, target):
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _imported(self, name: str, module) -> None:
        with self._lock:
            hooks = self._waiting.pop(name, [])
            self._leave_if_idle()
        for hook in hooks:
            hook.fire(module)

    def _leave_if_idle(self) -> None:
        self._waiting = {name: hooks for name, hooks in self._waiting.items() if hooks}
        if not self._waiting and self in sys.meta_path:
            sys.meta_path = [finder for finder in sys.meta_path if finder is not self]


_FINDER = _Finder()


class _ThenLoader:
    """The module's own loader, then `then(module)`; the module keeps its own loader, made or failed (a failed import
    leaves its hooks waiting: the next attempt runs them)."""

    def __init__(self, loader, then):
        self._loader = loader
        self._then = then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
        self._then(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)
