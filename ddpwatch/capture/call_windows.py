"""The flight recorder's marks of the calls that issue several ops, which the python recorder records once each."""

from __future__ import annotations

from .. import catalogue
from .record import Recorder
from .replacements import Patches


def patch(patches: Patches, recorder: Recorder, dist) -> None:
    """DDP's buffer broadcast and parameter check, the bucket rebuild and a synced backward's gradient all-reduce
    mark their time windows (Recorder.call_window), by which the flight recorder's feed folds their Flight Recorder
    entries into one record each (watch/flight_calls.py): a cost per call, not per op."""
    for name in catalogue.DDP_MULTI_OP_CALLS:
        patches.wrap(dist, name, lambda original: call_window_wrapper(recorder, original))
    reducer = getattr(dist, "Reducer", None)
    if reducer is not None:
        patches.wrap(reducer, catalogue.REDUCER_REBUILD, lambda original: call_window_wrapper(recorder, original))
    import torch.autograd

    patches.wrap(torch.autograd, "backward", lambda original: grad_sync_window_wrapper(recorder, original))


def call_window_wrapper(recorder: Recorder, original):
    window = recorder.call_window

    def call(*args, **kwargs):
        with window():
            return original(*args, **kwargs)

    return call


def grad_sync_window_wrapper(recorder: Recorder, original):
    """backward() after a synced DDP forward: its gradient all-reduce, one op per bucket, is one call."""

    def backward(*args, **kwargs):
        if recorder.take_pending_grad_sync() is None:
            return original(*args, **kwargs)
        with recorder.call_window():
            return original(*args, **kwargs)

    return backward
