"""The one frame classifier: ddpwatch/torch/stdlib (internal), an installed library, or the user's code; no torch.

Used live (capture/record.py, once per code object) and offline (Flight Recorder frames), so a frame is whose it
is in both. Live, the paths are this machine's: ddpwatch, torch and the standard library are told by where they
are installed here. Offline, a dump may come from another machine: they are told by path text. The rest is decided
the same way: an installed package (site-packages, dist-packages) is library code, the user's own line is
never there, unless the `user_packages` / `library_packages` options say otherwise.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from typing import NamedTuple

INTERNAL, LIBRARY, USER = 0, 1, 2

# ddpwatch's own folder (this file is at its top): none of its frames is ever the user's line, but the bundled
# examples, which play the user's part.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
EXAMPLES_DIR = os.path.join(PACKAGE_DIR, "examples") + os.sep
# The top-level package of an installed file; the last site-packages of the path (a venv can sit inside another).
_INSTALLED = re.compile(r".*(?:^|[/\\])(?:site|dist)-packages[/\\]([^/\\]+)")


class Packages(NamedTuple):
    """Top-level packages that count as the user's although installed, and as library code although not."""

    user: frozenset = frozenset()
    library: frozenset = frozenset()


NO_PACKAGES = Packages()


def packages(user=(), library=()) -> Packages:
    return Packages(frozenset(p for p in user if p), frozenset(p for p in library if p))


def installed_package(path: str) -> str | None:
    """The top-level package of a file under site-packages/dist-packages ('lightning'), else None."""
    match = _INSTALLED.match(path)
    if match is None:
        return None
    top = match.group(1)
    return top[:-3] if top.endswith(".py") else top


def classify(path: str, module: str | None = None, where=None, chosen: Packages = NO_PACKAGES) -> int:
    """INTERNAL, LIBRARY or USER for a frame in file `path` (`module`: the frame's __name__, when known).

    `where`: THIS_MACHINE for a live frame, DUMPED for a path read from a file."""
    if not path or path.startswith("<"):
        return INTERNAL  # <frozen importlib...>, <string>, ddpwatch's generated wrappers: no line a user can open
    where = where or THIS_MACHINE
    path = where.normal(path)
    own = where.own(path)
    if own is not None:
        return own
    package = installed_package(path)
    top = (module or "").split(".", 1)[0] or package
    if top and top in chosen.user:
        return USER
    if package is not None or (top and top in chosen.library):
        return LIBRARY
    # A virtualenv's site-packages can sit under the stdlib folder: handled above, as an installed package.
    return INTERNAL if where.stdlib(path) else USER


class _ThisMachine:
    """Paths of this process's own frames: ddpwatch, torch and the stdlib are where they are installed here."""

    _own_found: tuple = ()

    def __init__(self) -> None:
        paths = sysconfig.get_paths()
        self.stdlib_prefixes = tuple(
            dict.fromkeys(os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if paths.get(k))
        )

    @staticmethod
    def normal(path: str) -> str:
        return os.path.abspath(path)

    def own(self, path: str) -> int | None:
        if path.startswith(self.own_prefixes()):
            return USER if path.startswith(EXAMPLES_DIR) else INTERNAL
        return None

    def stdlib(self, path: str) -> bool:
        return path.startswith(self.stdlib_prefixes)

    def own_prefixes(self) -> tuple:
        """Found on first use, not at import: imported at interpreter start-up (.pth), sys.path may not list torch
        yet."""
        if len(self._own_found) < 2:  # ddpwatch's own folder only: torch not found yet, look again
            self._own_found = _find_own_prefixes()
        return self._own_found


def _find_own_prefixes() -> tuple:
    """Folders of ddpwatch and torch: their frames are never the user's line."""
    prefixes = [PACKAGE_DIR + os.sep]
    torch = sys.modules.get("torch")
    locations = list(getattr(torch, "__path__", None) or ())
    if not locations:
        try:
            import importlib.util

            spec = importlib.util.find_spec("torch")
            locations = list(spec.submodule_search_locations or ()) if spec else []
        except (ImportError, ValueError):
            locations = []
    prefixes.extend(os.path.abspath(p) + os.sep for p in locations)
    return tuple(dict.fromkeys(prefixes))


# Dumped paths (by path text, so dumps from other machines classify the same way).
_TORCH_FILE = re.compile(
    r"(^|[/\\])(site|dist)-packages[/\\]torch[/\\]|(^|[/\\])torch[/\\](distributed|nn|autograd|"
    r"utils|optim|_dynamo|_C|cuda|fx|_functorch|multiprocessing)[/\\]|(^|[/\\])torch[/\\]"
    r"(_tensor|functional|_ops|_compile|_utils|overrides|serialization|library|__init__)\.py$"
)
_STDLIB_FILE = re.compile(r"[/\\]lib[/\\]python3(\.\d+)?[/\\](?!.*(site|dist)-packages)")
# ddpwatch's own files at any depth (ddpwatch/capture/wrappers.py), but not its examples, which play the user's part.
_DDPWATCH_FILE = re.compile(r"(^|[/\\])ddpwatch[/\\](?!examples[/\\])([^/\\]+[/\\])*[^/\\]+\.py$")
_DDPWATCH_EXAMPLE = re.compile(r"(^|[/\\])ddpwatch[/\\]examples[/\\]")


# The frames a report folds away as ddpwatch's own (render: "... 3 ddpwatch frames"), told from the path alone so
# that a report renders the same on any machine: a file in the package or one folder below it (not the bundled
# examples, which play the user's part), the start-up hook, and the generated per-collective wrappers
# "<ddpwatch hot path: barrier>". At most one folder deep: torch in a virtualenv inside a checkout named ddpwatch
# (ddpwatch/.venv/lib/.../torch/...) stays torch. Also read by report.html's script.
OWN_FRAME_FILE = re.compile(
    r"(^|[/\\])ddpwatch[/\\]((?!examples[/\\])[^/\\]+[/\\])?[^/\\]+\.py$"
    r"|(^|[/\\])_ddpwatch_startup\.py$|^<ddpwatch "
)


class _Dumped:
    """Paths written by another process, maybe on another machine: told by their text."""

    @staticmethod
    def normal(path: str) -> str:
        return path

    @staticmethod
    def own(path: str) -> int | None:
        if _DDPWATCH_EXAMPLE.search(path):
            return USER
        if _TORCH_FILE.search(path) or _DDPWATCH_FILE.search(path):
            return INTERNAL
        return None

    @staticmethod
    def stdlib(path: str) -> bool:
        return bool(_STDLIB_FILE.search(path))


THIS_MACHINE = _ThisMachine()
DUMPED = _Dumped()
