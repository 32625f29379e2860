"""Reading a wrapped function's arguments by name, wherever the caller put them (positional or keyword)."""

from __future__ import annotations

import inspect


def param_index(signature: inspect.Signature, name: str):
    """The position of parameter `name` in the signature, or None when it has none."""
    names = list(signature.parameters)
    return names.index(name) if name in names else None


def arg(args, kwargs, index, name, default=None):
    """The value passed for a parameter, by position `index` or by `name`; `default` when not passed."""
    if index is not None and index < len(args):
        return args[index]
    return kwargs.get(name, default)
