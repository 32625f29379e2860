"""Records torch's functional collectives (DTensor, tensor parallel): issued by one call, done at wait_tensor()."""

from __future__ import annotations

import functools
import inspect
import weakref

from .. import catalogue
from .tensors import tensor_meta

MODULE = "torch.distributed._functional_collectives"
FUNCTIONAL_COLLECTIVES = catalogue.FUNCTIONAL_COLLECTIVES  # name -> canonical op; waited by wait_tensor()
WAIT = "wait_tensor"


def patch_functional_collectives(patcher) -> None:
    """Wrap every functional collective and wait_tensor in torch's module (the one DTensor calls through)."""
    try:
        import importlib

        module = importlib.import_module(MODULE)
    except Exception:
        return  # a torch without functional collectives
    pending = _Pending(patcher.recorder)
    for name, op in FUNCTIONAL_COLLECTIVES.items():
        patcher.wrap(
            module, name, lambda original, name=name, op=op: _issue_wrapper(patcher, pending, original, name, op)
        )
    patcher.wrap(module, WAIT, lambda original: _wait_wrapper(pending, original))


class _Pending:
    """Outputs of issued functional collectives not yet waited on: id(tensor) -> (weak ref, record, outputs left)."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.outputs: dict = {}

    def track(self, record, outputs: list) -> None:
        state = {"left": 0}
        for tensor in outputs:
            try:
                ref = weakref.ref(tensor, functools.partial(self._dropped, id(tensor)))
            except TypeError:
                continue
            self.outputs[id(tensor)] = (ref, record, state)
            state["left"] += 1
        if not state["left"]:
            self.recorder.finish(record)  # nothing to wait on (already waited, or traced): done when issued

    def _dropped(self, key, _ref) -> None:
        """An output freed without a wait_tensor: nobody can block on it any more (runs in the garbage collector)."""
        try:
            self._one_done(key, None)
        except Exception:
            pass

    def waiting(self, tensor, now: bool) -> None:
        """A thread enters (now=True) or leaves wait_tensor() on `tensor`: its record is being waited on."""
        entry = self.outputs.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            entry[1].waiting = now

    def waited(self, tensor, error) -> None:
        self._one_done(id(tensor), tensor, error)

    def _one_done(self, key, tensor, error=None) -> None:
        entry = self.outputs.get(key)
        if entry is None or (tensor is not None and entry[0]() is not tensor):
            return
        del self.outputs[key]
        _, record, state = entry
        state["left"] -= 1
        if error is not None:
            self.recorder.finish(record, error)
        elif state["left"] <= 0 and record.end_mono is None:
            self.recorder.finish(record)


def _issue_wrapper(patcher, pending: _Pending, original, api: str, op: str):
    names = list(inspect.signature(original).parameters)
    group_i = names.index("group") if "group" in names else None
    recorder = patcher.recorder

    def body(args, kwargs, caller):
        record = _begin(patcher, api, op, args, kwargs, group_i, caller)
        if record is None:
            return original(*args, **kwargs)
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            recorder.finish(record, exc)
            raise
        try:
            pending.track(record, _waitable_outputs(result))
            if record.end_mono is None:
                record.returned = True  # pending until wait_tensor(): the rank is not waiting in it meanwhile
        except Exception:
            recorder.finish(record)
        return result

    return patcher._outermost(original, body)  # nested calls (permute_tensor -> all_to_all_single) record once


def _begin(patcher, api: str, op: str, args, kwargs, group_i, caller):
    try:
        group = args[group_i] if group_i is not None and group_i < len(args) else kwargs.get("group")
        tensors = args[0] if args else next(iter(kwargs.values()), None)
        pg = _process_group(group, kwargs.get("tag", ""))
        if pg is None:
            return None
        return patcher._begin(op, f"funcol.{api}", pg, tensor_meta(tensors), caller)
    except Exception:
        return None


def _process_group(group, tag: str):
    """The ProcessGroup behind a functional collective's group argument (a group, mesh, (mesh, dim), name, ranks)."""
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed import _functional_collectives as funcol

    if isinstance(group, c10d.ProcessGroup):
        return group
    name = funcol._resolve_group_name(group, tag)
    return c10d._resolve_process_group(name)


def _waitable_outputs(result) -> list:
    """The plain tensors that wait_tensor() will be called on: AsyncCollectiveTensor.elem, in a list or alone."""
    items = result if isinstance(result, (list, tuple)) else [result]
    outputs = []
    for item in items:
        elem = getattr(item, "elem", None)
        if (
            elem is not None
            and type(item).__name__ == "AsyncCollectiveTensor"
            and not getattr(item, "completed", False)
        ):
            outputs.append(elem)
    return outputs


def _wait_wrapper(pending: _Pending, original):
    def wait_tensor(tensor, *args, **kwargs):
        if not pending.outputs:
            return original(tensor, *args, **kwargs)
        try:
            pending.waiting(tensor, True)
        except Exception:
            pass  # bookkeeping only: the wait itself must happen
        try:
            result = original(tensor, *args, **kwargs)
        except BaseException as exc:
            pending.waited(tensor, exc)
            raise
        try:
            pending.waited(tensor, None)
        except Exception:  # the wait happened; a bookkeeping failure must not become the user's
            pass
        return result

    return wait_tensor
