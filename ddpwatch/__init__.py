"""ddpwatch: catches hangs in distributed PyTorch training and says which rank, which line, why, and the fix."""

__version__ = "0.1.0"
__all__ = ["guard", "install", "uninstall", "ConfigError", "__version__"]

# Loaded on first use (PEP 562), not here: with DDPWATCH=1 every Python process imports this package at start-up,
# and most of them (tools, DataLoader workers, the torchrun agent) never touch the guard.
_LAZY = {"guard": "session", "install": "session", "uninstall": "session", "ConfigError": "config"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpwatch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"ddpwatch.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
