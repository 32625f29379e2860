"""Reads the user's Python source for static analysis: one PEP 263-aware reader and a parse cache (mtime, size)."""

from __future__ import annotations

import ast
import os
import threading
import tokenize

__all__ = ["read_source", "parsed_file", "clear_cache"]

_cache: dict[str, tuple[tuple[int, int], ast.Module | None, list[str]]] = {}
_cache_lock = threading.Lock()
_CACHE_LIMIT = 256


def read_source(path: str) -> str:
    """The text of the Python file at ``path``, decoded as its encoding declaration says (PEP 263)."""
    with tokenize.open(path) as handle:
        return handle.read()


def parsed_file(path: str) -> tuple[ast.Module | None, list[str]]:
    """The parsed tree and lines of ``path``, from the cache while the file's mtime and size are unchanged."""
    stat = os.stat(path)
    stamp = (stat.st_mtime_ns, stat.st_size)
    with _cache_lock:
        cached = _cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1], cached[2]
    source = read_source(path)
    try:
        tree: ast.Module | None = ast.parse(source)
    except (SyntaxError, ValueError):
        tree = None
    lines = source.splitlines()
    with _cache_lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[path] = (stamp, tree, lines)
    return tree, lines


def clear_cache() -> None:
    """Forget every parsed file (tests, or a long-lived process whose sources changed in place)."""
    with _cache_lock:
        _cache.clear()
