"""`ddpwatch run` puts this folder first on PYTHONPATH: activate ddpwatch, then run the sitecustomize it hides."""

import os
import sys


def _activate():
    if getattr(sys.modules.get("_ddpwatch_startup"), "attempted", False):
        return  # ddpwatch-startup.pth got there first (and said so if it failed)
    try:
        from ddpwatch.bootstrap import process_startup

        process_startup(via="sitecustomize")
    except Exception as exc:  # never break the program (a bad setting is a warning inside process_startup)
        sys.stderr.write(f"ddpwatch: start-up activation failed ({type(exc).__name__}: {exc}); running unwatched\n")


def _chain_to_the_users_sitecustomize():
    """Python imports one sitecustomize; ours came first on the path, so import the next one too (ddtrace does)."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401  (the user's, if any)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_activate()
_chain_to_the_users_sitecustomize()
