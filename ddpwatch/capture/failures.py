"""A collective that raises, under the flight recorder: seen where torch itself logs the failure, at no cost before."""

# With no per-op wrapper, nothing in Python sees a synchronous collective fail (gloo's "Connection closed by peer"
# after a peer died). torch does: every public collective is decorated with c10d_logger._exception_logger, which
# logs the failure to its module's `_c10d_logger`, on the failing thread, inside its except block, then re-raises.
# Standing in for that logger costs nothing until a collective fails.

from __future__ import annotations

import inspect
import sys

from .. import catalogue
from ..logonce import log_once
from .replacements import PATCH_MARKER
from .tensors import tensor_meta

_logged: set = set()


def install(patcher) -> None:
    """Stand in for c10d_logger's logger through the Patcher's Patches (undone with them; once: idempotent)."""
    from torch.distributed import c10d_logger

    logger = getattr(c10d_logger, "_c10d_logger", None)
    if logger is not None and not hasattr(logger, PATCH_MARKER):
        patcher.patches.replace(c10d_logger, "_c10d_logger", FailureListener(logger, patcher))


class FailureListener:
    """torch.distributed.c10d_logger's logger, with one more duty: a failed collective becomes a failed Record (its
    user's line, tensors and the group's sequence number) and reaches the Recorder's failure hook (the watchdog), as
    the per-op wrapper's record would have. Everything else is the logger's own."""

    def __init__(self, logger, patcher):
        self._logger = logger
        self._patcher = patcher
        self._last_error: int | None = None  # id of the error recorded last: an object collective re-raises it

    def __getattr__(self, name: str):
        return getattr(self._logger, name)

    def debug(self, msg, *args, **kwargs):
        try:
            self._record_failure(sys._getframe(1))
        except Exception:  # never the user's problem: their error goes on as torch raised it
            log_once(_logged, "failure", "ddpwatch: could not record a failed collective", exc_info=True)
        return self._logger.debug(msg, *args, **kwargs)

    def _record_failure(self, frame) -> None:
        """From c10d_logger's wrapper frame (its locals: func, args, kwargs, error): a failed Record."""
        names = frame.f_locals
        func, error = names.get("func"), names.get("error")
        if func is None or not isinstance(error, BaseException) or id(error) == self._last_error:
            return
        entry = catalogue.tensor_collectives().get(getattr(func, "__name__", ""))
        if entry is None:
            return  # point-to-point ops keep their wrapper (it records its own failure); group creation is no op
        self._last_error = id(error)
        arguments = _arguments(func, names.get("args") or (), names.get("kwargs") or {})
        group = arguments.get("group")
        name = self._patcher.group_name(group)
        if not name:
            return
        tensors = tensor_meta(arguments.get(entry.tensors[0])) if entry.tensors else ()
        recorder = self._patcher.recorder
        record = recorder.begin(entry.op, func.__name__, name, tensors, frame.f_back)
        record.seq = _sequence_number(group, record.seq)
        recorder.finish(record, error)


def _arguments(func, args: tuple, kwargs: dict) -> dict:
    try:
        return dict(inspect.signature(func).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {}


def _sequence_number(group, otherwise: int) -> int:
    """The failed op's position as the Flight Recorder counts it (from 0): the group's sequence number, which the op
    has already advanced."""
    try:
        from torch.distributed import distributed_c10d as c10d

        pg = c10d._world.default_pg if group is None else group
        return int(pg._get_sequence_number_for_group()) - 1  # type: ignore[union-attr]  # bound, not in the stubs
    except Exception:
        return otherwise
