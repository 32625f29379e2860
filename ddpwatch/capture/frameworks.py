"""What a framework was doing for the user when it issued a collective, read from the blocked thread's live frames.

Lightning's `self.log(..., sync_dist=True)` reduces later, at epoch end, from deep inside the trainer: the user's
line is not on the stack at all. The metric being reduced is (`_ResultMetric.meta`), and so is the LightningModule,
whose source names the `self.log` call. Read only from the watchdog thread, only for a rank already waiting.
"""

from __future__ import annotations

import ast
import inspect
import os

from ..static.source import parsed_file
from .sites import installed_package


def framework_context(frame) -> dict | None:
    """{"framework", "call", "description", "site", ...} for the innermost frame a known framework probe reads."""
    outer = []
    probe_hit = None
    while frame is not None:
        outer.append(frame)
        if probe_hit is None and _is_lightning_metric_compute(frame):
            probe_hit = frame
        frame = frame.f_back
    if probe_hit is None:
        return None
    try:
        return _lightning_logged_metric(probe_hit, outer)
    except Exception:  # a framework version with other internals: no context rather than a crash
        return None


def _is_lightning_metric_compute(frame) -> bool:
    code = frame.f_code
    return (
        code.co_name == "compute"
        and code.co_filename.endswith(os.path.join("logger_connector", "result.py"))
        and installed_package(os.path.abspath(code.co_filename)) in ("lightning", "pytorch_lightning")
    )


def _lightning_logged_metric(frame, frames: list) -> dict | None:
    metric = frame.f_locals.get("self")
    meta = getattr(metric, "meta", None)
    name, hook = getattr(meta, "name", None), getattr(meta, "fx", None)
    if not isinstance(name, str):
        return None
    module = _lightning_module(frames)
    site = _log_call_site(type(module), name, hook) if module is not None else None
    return {
        "framework": "lightning",
        "call": "log",
        "metric": name,
        "hook": hook,
        "site": site,
        "description": f"Lightning's epoch-end reduction of `{name}` (logged with `self.log(..., sync_dist=True)`"
        + (f" in `{hook}`" if hook else "")
        + ")",
    }


def _lightning_module(frames: list):
    for frame in frames:
        for key in ("trainer", "self"):
            module = getattr(frame.f_locals.get(key), "lightning_module", None)
            if module is not None:
                return module
    return None


def _log_call_site(module_class, name: str, hook: str | None) -> dict | None:
    """The `self.log("name", ...)` / `self.log_dict({"name": ...})` call in the module's source file."""
    path = inspect.getsourcefile(module_class)
    if not path or not os.path.isfile(path):
        return None
    tree, _ = parsed_file(path)  # static.source's cache: the same file is parsed again for its rank conditions
    if tree is None:
        return None
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and _logs_metric(node, name):
                found.append((function.name != hook, node.lineno, function.name))
    if not found:
        return None
    _, line, name = min(found)  # a call inside the hook that logged it first, then the first in the file
    return {"file": path, "line": line, "function": name}


def _logs_metric(call: ast.Call, name: str) -> bool:
    attribute = call.func.attr if isinstance(call.func, ast.Attribute) else None
    first = call.args[0] if call.args else None
    if attribute == "log":
        return isinstance(first, ast.Constant) and first.value == name
    if attribute == "log_dict" and isinstance(first, ast.Dict):
        return any(isinstance(key, ast.Constant) and key.value == name for key in first.keys)
    return False
