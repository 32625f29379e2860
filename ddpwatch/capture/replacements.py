"""The one door for replacing a function (Patches): every replacement ddpwatch makes is marked with its original and
undone, newest first."""

from __future__ import annotations

import functools

from .after_import import when_imported

PATCH_MARKER = "__ddpwatch_original__"


class Patches:
    """The one door for replacing a function: marks the wrapper with the original (PATCH_MARKER), keeps an undo list,
    puts the originals back in reverse order. The Patcher, the session's lifecycle hooks and the zero-code
    activation hook all go through it, so a patch left behind is found (and undone) the same way wherever it came
    from."""

    def __init__(self):
        self._undo: list = []  # (owner, attribute, wrapper, original), in the order they were made
        self._pending: list = []  # after_import hooks for modules not imported yet

    def __bool__(self) -> bool:
        return bool(self._undo)

    def replace(self, owner, attribute: str, wrapper):
        """Put `wrapper` at owner.attribute, marked with what was there; returns that original."""
        original = getattr(owner, attribute)
        setattr(wrapper, PATCH_MARKER, original)
        setattr(owner, attribute, wrapper)
        self._undo.append((owner, attribute, wrapper, original))
        return original

    def wrap(self, owner, attribute: str, make_wrapper):
        """Replace owner.attribute with make_wrapper(original) (its name and docstring kept); the original, or None
        when there is none or it is already ddpwatch's (idempotent: nothing is done)."""
        original = getattr(owner, attribute, None)
        if original is None or not callable(original) or hasattr(original, PATCH_MARKER):
            return None  # not in this torch version, or someone else's ddpwatch already patched it
        self.replace(owner, attribute, functools.wraps(original)(make_wrapper(original)))
        return original

    def wrap_when_imported(self, module_name: str, owner: str, attribute: str, make_wrapper) -> None:
        """wrap() module_name.owner.attribute now if the module is imported, else once the program imports it:
        patching never imports a module itself."""

        def wrap_in(module) -> None:
            target = getattr(module, owner, None)
            if target is not None:
                self.wrap(target, attribute, make_wrapper)

        self._pending.append(when_imported(module_name, wrap_in))

    def wrap_public(self, dist, c10d, name: str, make_wrapper) -> None:
        """wrap() distributed_c10d.X (internal calls use it) and put the same wrapper at torch.distributed.X when
        that is the same function."""
        original = self.wrap(c10d, name, make_wrapper)
        if original is not None and getattr(dist, name, None) is original:
            self.replace(dist, name, getattr(c10d, name))

    def made(self) -> tuple:
        """(owner, attribute, wrapper, original) of every patch in place, oldest first (a benchmark switches them
        off and on between two training steps without making new wrappers)."""
        return tuple(self._undo)

    def undo(self, only_where_ours: bool = False) -> None:
        """Put every original back, newest first. `only_where_ours`: leave an attribute that now holds something
        else (a hook that outlives sessions must not remove what the program installed over it)."""
        while self._pending:
            self._pending.pop().cancel()  # first: a wrap in progress on an importing thread finishes, then is undone
        while self._undo:
            owner, attribute, wrapper, original = self._undo.pop()
            if not only_where_ours or getattr(owner, attribute, None) is wrapper:
                setattr(owner, attribute, original)
