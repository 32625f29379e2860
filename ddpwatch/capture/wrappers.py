"""The wrappers on torch.distributed's collectives and DDP's internals that feed a Recorder (the Patcher puts them
in place through replacements.py: idempotent, always restorable)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import sys
import threading
import weakref

from .. import catalogue
from ..format import build
from ..logonce import log_once
from . import call_windows, point_to_point
from .replacements import PATCH_MARKER, Patches
from .record import Recorder
from .signatures import signature_source
from .hot_path import HOT_PATH, root_store
from .tensors import tensor_meta

# What gets patched comes from the one catalogue (catalogue.py), shared with lint and the Flight Recorder reader.
COLLECTIVES = {name: (entry.op, entry.tensors) for name, entry in catalogue.tensor_collectives().items()}
OBJECT_COLLECTIVES = catalogue.object_collectives()
P2P, BATCH_P2P, COALESCING_MANAGER = catalogue.P2P, catalogue.BATCH_P2P, catalogue.COALESCING_MANAGER
# Backends whose collectives are done when the Python call (or Work.wait()) returns: the op runs on the host.
# Every other backend (nccl, xccl, hccl, custom ones) may return before the device finished: there completion is
# what Work.is_completed() says. Unknown backends are treated as device-asynchronous, which can only delay a
# completion, never invent one.
FSDP2_STATE_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_state"
HOST_SYNC_BACKENDS = frozenset({"gloo", "mpi", "fake"})
_logged: set = set()
_get_ident = threading.get_ident


def _log_once(key: str, message: str) -> None:
    """Once per process for each key, with the exception being handled."""
    log_once(_logged, key, message, exc_info=True)


class Patcher:
    """Owns every patch ddpwatch makes: applies them once, keeps the originals, puts them back."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.patches = Patches()
        # id(process group) -> (weak reference, name, runs on the host): a destroyed group is not kept alive.
        self._group_cache: dict = {}
        self._lock = threading.Lock()
        self._wait_hooked = False
        self._per_op = True
        # The flight recorder's call windows (call_windows.py), kept apart: the per-op wrappers replace them.
        self._windows = Patches()

    @property
    def active(self) -> bool:
        return bool(self.patches)

    # ----- applying and restoring -----
    def patch(self, per_op: bool = True) -> None:
        """Apply the patches once. `per_op` false (the flight recorder, watch/flight.py): no wrapper on any
        collective, torch's Flight Recorder keeps that record; only the regions a Python hook alone sees are
        patched, at a cost per forward (DDP's and FSDP2's, which also count the training steps)."""
        with self._lock:
            if self.patches:
                return
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d

            self._c10d = c10d
            self._per_op = per_op
            self._patch_forward_regions()
            self._patch_point_to_point(dist, c10d)
            if per_op:
                self._patch_per_op(dist, c10d)
            else:
                call_windows.patch(self._windows, self.recorder, dist)

    @property
    def per_op(self) -> bool:
        """Whether every collective has its wrapper (the python recorder)."""
        return bool(self.patches) and self._per_op

    def add_per_op(self) -> None:
        """The per-op wrappers after all: the flight recorder was asked for, but the process group, known only once
        it exists, is one it does not serve (watch/flight_support.py: backend_unsupported)."""
        with self._lock:
            if not self.patches or self._per_op:
                return
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d

            self._per_op = True
            self._windows.undo()  # the python recorder's own wrappers record these calls, once each
            self._patch_per_op(dist, c10d)

    def _patch_point_to_point(self, dist, c10d) -> None:
        """A wrapper on every point-to-point op, under both recorders: gloo's Flight Recorder writes no entry for
        them (it only counts them in the group's sequence number)."""
        for name, (op, peer_param) in P2P.items():
            self._patch_function(
                dist,
                c10d,
                name,
                lambda orig, n=name, o=op, p=peer_param: point_to_point.p2p_wrapper(self, orig, n, o, p),
            )
        self._patch_function(dist, c10d, BATCH_P2P, lambda orig: point_to_point.batch_wrapper(self, orig))

    def _patch_per_op(self, dist, c10d) -> None:
        """A wrapper on every collective and DDP internal that issues one: the python recorder."""
        for name, (op, tensor_params) in COLLECTIVES.items():
            self._patch_function(
                dist,
                c10d,
                name,
                lambda orig, n=name, o=op, t=tensor_params: self._collective_wrapper(orig, n, o, t),
            )
        self._patch_function(dist, c10d, COALESCING_MANAGER, self._coalescing_wrapper)
        for name in OBJECT_COLLECTIVES:
            self._patch_function(
                dist,
                c10d,
                name,
                lambda orig, n=name: self._region_wrapper(orig, build.OBJECT_COLLECTIVE, n, skip_self=False),
            )
        self._patch_ddp_internals(dist)
        from .functional import patch_functional_collectives

        patch_functional_collectives(self)

    def unpatch(self) -> None:
        with self._lock:
            self._windows.undo()
            self.patches.undo()
            self._group_cache.clear()
            self._wait_hooked = False

    def wrap(self, owner, attribute: str, make_wrapper):
        """Patches.wrap, undone by unpatch()."""
        return self.patches.wrap(owner, attribute, make_wrapper)

    def _patch_function(self, dist, c10d, name: str, make_wrapper) -> None:
        """Install one wrapper under both torch.distributed.X and distributed_c10d.X (internal calls use the latter)."""
        self.patches.wrap_public(dist, c10d, name, make_wrapper)

    def _patch_ddp_internals(self, dist) -> None:
        for name, op in catalogue.DDP_MULTI_OP_CALLS.items():
            original = getattr(dist, name, None)
            if original is not None and not hasattr(original, PATCH_MARKER):
                self.patches.replace(dist, name, self._group_first_wrapper(original, name, op))
        reducer = getattr(dist, "Reducer", None)
        rebuild = getattr(reducer, catalogue.REDUCER_REBUILD, None)
        if rebuild is not None and not hasattr(rebuild, PATCH_MARKER):
            self.patches.replace(reducer, catalogue.REDUCER_REBUILD, self._rebuild_wrapper(rebuild))
        import torch.autograd

        self.wrap(torch.autograd, "backward", self._backward_wrapper)

    def _patch_forward_regions(self) -> None:
        """DDP's and FSDP2's forward as regions (and a grad-enabled DDP forward counted as a step): both recorders."""
        from torch.nn.parallel import DistributedDataParallel

        self.wrap(DistributedDataParallel, "forward", self._ddp_forward_wrapper)
        self._patch_fsdp2_forward()
        self._patch_join_regions()

    def _patch_join_regions(self) -> None:
        """torch's Join: a joinable's per-iteration notice (DDP.forward, ZeroRedundancyOptimizer.step call it) and the
        context's exit, where the joined ranks shadow the others' collectives with unlike ones of their own (a
        region: analysis/silent.py compares no such position). Both are looked up on the class when called
        (`Join.notify_join_context(self)`), so a plain function in place of the staticmethod serves."""
        try:
            from torch.distributed.algorithms.join import Join
        except ImportError:
            return
        for name in ("notify_join_context", "__exit__"):
            self.wrap(
                Join,
                name,
                lambda original, n=name: self._region_wrapper(original, build.TORCH_JOIN, f"Join.{n}", skip_self=False),
            )

    def _patch_fsdp2_forward(self) -> None:
        """FSDP2's pre-forward hook all-gathers the module's parameters: a region, like DDP.forward.

        Patched once the program imports FSDP2 (importing it here would cost every rank 0.6 s of CPU for DTensor
        and sympy); the hook is bound when fully_shard() runs, so models sharded before the guard started are not
        covered.
        """
        self.patches.wrap_when_imported(
            FSDP2_STATE_MODULE,
            "FSDPState",
            "_pre_forward",
            lambda pre_forward: self._region_wrapper(
                pre_forward, build.FSDP_FORWARD, "fully_shard forward", skip_self=False
            ),
        )

    # ----- process groups -----
    def group_name(self, group):
        """A name every rank gives the same group (torch's own pg name), or None for a group this rank is not in."""
        c10d = self._c10d
        pg = c10d._world.default_pg if group is None else group
        entry = self._group_cache.get(id(pg))
        if entry is not None and entry[0]() is pg:
            return entry[1] or None
        name = self._describe_group(pg)
        try:
            self._group_cache[id(pg)] = (weakref.ref(pg), name, bool(name) and self.recorder.runs_on_host(name))
        except TypeError:  # an object that takes no weak reference: describe it every time rather than pin it
            pass
        return name or None

    def _describe_group(self, pg) -> str:
        c10d = self._c10d
        if pg is None or pg is getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object()):
            return ""
        try:
            name = c10d._get_process_group_name(pg)
        except Exception:
            name = ""
        name = name or f"pg-{id(pg):x}"
        try:
            ranks = None if pg is c10d._world.default_pg else list(c10d.get_process_group_ranks(pg))
        except Exception:
            ranks = None
        self.recorder.note_group(name, ranks, _runs_on_host(c10d, pg))
        return name

    # ----- wrappers -----
    def _begin(self, op: str, api: str, group, tensors, caller, peer=None):
        """Start a record, or None when the call is not ours to record or ddpwatch itself failed.

        Never raises: a bug here must cost a record, not the user's collective.
        """
        try:
            name = self.group_name(group)
            if not name:
                return None
            return self.recorder.begin(op, api, name, tensors() if callable(tensors) else tensors, caller, peer)
        except Exception:
            _log_once("begin", "ddpwatch: could not record a collective; it runs unrecorded")
            return None

    def _outermost(self, original, body):
        """Run `body` for the outermost patched call on this thread; nested patched calls go straight through."""
        busy, mark_busy, unmark_busy, _, _ = self.recorder.hot_path_parts()

        def wrapper(*args, **kwargs):
            ident = _get_ident()
            if ident in busy:
                return original(*args, **kwargs)
            mark_busy(ident)
            try:
                return body(args, kwargs, sys._getframe(1))
            finally:
                unmark_busy(ident)

        return wrapper

    def _finish_on_error(self, record, call, *args, **kwargs):
        """Call through; on the user's error, close the record and re-raise the very same exception."""
        try:
            return call(*args, **kwargs)
        except BaseException as exc:
            self.recorder.finish(record, exc)
            raise

    def _collective_wrapper(self, original, api: str, op: str, tensor_params):
        """The hot path (every all_reduce, barrier...): one flat function with the original's own signature.

        Generated from HOT_PATH with the collective's parameters (see there why); the arguments arrive as named
        locals instead of being packed into *args/**kwargs and looked up again.
        """
        signature = inspect.signature(original)
        names = set(signature.parameters)
        if any(name.startswith("_w_") for name in names):
            raise ValueError(f"{original.__name__} has a parameter named _w_...: the generated wrapper's own names")
        params, call, defaults = signature_source(signature)
        metas = " + ".join(f"_w_meta({p})" if p in names else "()" for p in tensor_params) or "()"
        if len(tensor_params) == 1 and tensor_params[0] in names:  # most collectives: one tensor, usually plain
            t = tensor_params[0]
            metas = f"(({t}.shape, {t}.dtype),) if type({t}) is _w_tensor_type else _w_meta({t})"
        source = HOT_PATH.format(
            name=original.__name__,
            params=params,
            call=call,
            metas=metas,
            group="group" if "group" in names else "None",
            # the reduce op and a rooted call's root, kept raw (an enum member, ints): an attribute store each
            kept=("_w_record.reduce = op\n        " if "op" in names else "") + root_store(names),
            async_op="async_op" if "async_op" in names else "False",
        )
        recorder, world = self.recorder, self._c10d._world
        busy, mark_busy, unmark_busy, issuing, _ = recorder.hot_path_parts()
        namespace = {
            **defaults,
            "_w_getframe": sys._getframe,
            "_w_id": id,
            "_w_get_ident": _get_ident,
            "_w_log_once": _log_once,
            "_w_original": original,
            "_w_op": op,
            "_w_api": api,
            "_w_recorder": recorder,
            "_w_busy": busy,
            "_w_mark_busy": mark_busy,
            "_w_unmark_busy": unmark_busy,
            "_w_issuing": issuing,
            "_w_begin": recorder.begin,
            "_w_finish_returned": recorder.finish_returned,
            "_w_world": world,
            "_w_coalescing": world.pg_coalesce_state,
            "_w_cache": self._group_cache,
            "_w_group_name": self.group_name,
            "_w_hook_wait": self.hook_work_wait,
            "_w_meta": tensor_meta,
            "_w_tensor_type": getattr(sys.modules.get("torch"), "Tensor", None),  # patching imported torch
            # _World.default_pg is a Python property returning _default_pg: read the attribute, a call less per op.
            "_w_direct_default": hasattr(world, "_default_pg"),
        }
        # "<...>": record.file_kind calls it internal. "importlib._bootstrap" in the name: warnings' frame walk skips
        # frames whose file names both "importlib" and "_bootstrap" (CPython's is_internal_frame, 3.8-3.13), so a
        # warning raised inside the original with stacklevel=2 names the user's line, as without the wrapper, at no
        # cost to the call (skip_file_prefixes, the proper way, is 3.12+ and per call).
        filename = f"<ddpwatch hot path: {original.__name__} (skipped by warnings, as importlib._bootstrap)>"
        exec(compile(source, filename, "exec"), namespace)
        # Tracebacks through the wrapper show its source, as for any other file (mtime None: never reloaded).
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        return namespace[original.__name__]

    def hook_work_wait(self) -> None:
        """Work.wait() returning is when a host-synchronous op is done; on a device it only hands over the Work.

        Hooked on first need (an async call, a group on a device backend), not at patch time: the synchronous calls
        of a host backend, most of a DDP loop, then pay nothing for it. Backends written in Python (their Work a
        Python subclass with its own wait) are hooked too: a synchronous call's Work is only seen there, when c10d
        waits on it inside the call.
        """
        if self._wait_hooked:
            return
        try:
            with self._lock:
                if not self._wait_hooked and self.patches:
                    self._patch_work_wait(self._c10d)
                    self._wait_hooked = True
        except Exception:  # never the user's problem: such ops then complete through is_completed() polls only
            self._wait_hooked = True
            _log_once("wait-hook", "ddpwatch: could not hook Work.wait; async ops complete by polling only")

    def _patch_work_wait(self, c10d) -> None:
        work_class = getattr(c10d, "Work", None)
        if work_class is None:
            return
        for cls in [work_class] + _subclasses(work_class):
            original = cls.__dict__.get("wait")
            if original is not None and callable(original) and not hasattr(original, PATCH_MARKER):
                self.patches.replace(cls, "wait", functools.wraps(original)(self._wait_wrapper(original)))

    def _wait_wrapper(self, original):
        recorder = self.recorder
        _, _, _, issuing, by_work = recorder.hot_path_parts()
        in_wait = recorder.wait_marks()

        def wait(work, *args, **kwargs):
            # Which Work this thread is blocked on: a rank whose isend/irecv is merely in flight while it computes
            # is not waiting, and a P2P deadlock is proven only over ranks that are. Only a Work handed to the user
            # (in by_work) is noted: the waits inside a synchronous collective pay one lookup, no store.
            ident = _get_ident() if id(work) in by_work else None
            if ident is not None:
                in_wait[ident] = work
            try:
                result = original(work, *args, **kwargs)
            except BaseException as exc:
                _note_wait(work, exc)
                raise
            finally:
                if ident is not None:
                    in_wait.pop(ident, None)
            if by_work or issuing:  # else no recorded op waits on this Work
                _note_wait(work, None)
            return result

        def _note_wait(work, error) -> None:
            try:
                recorder.waited(work, issuing.get(_get_ident()), error)
            except Exception:  # never the user's problem: the wait itself already happened
                _log_once("wait", "ddpwatch: could not note a Work.wait(); a record may stay in flight")

        return wait

    def _coalescing_wrapper(self, original):
        """_coalescing_manager queues the collectives inside it and issues them as one op at its exit: record that."""
        patcher = self
        recorder = self.recorder
        busy, *_ = recorder.hot_path_parts()  # read only: is this thread inside a patched call?

        @contextlib.contextmanager
        def coalescing(group=None, device=None, async_ops=False):
            context = original(group, device, async_ops)
            manager = context.__enter__()
            try:
                yield manager
            except BaseException:
                if not context.__exit__(*sys.exc_info()):
                    raise
                return
            queued = list(
                patcher._c10d._world.pg_coalesce_state.get(patcher._c10d._world.default_pg if group is None else group)
                or ()
            )
            record = None
            if queued and _get_ident() not in busy:
                op_name = getattr(queued[0].op, "__name__", "collective")
                canonical = catalogue.canonical_op(op_name)
                record = patcher._begin(
                    canonical,
                    f"{op_name} (coalesced x{len(queued)})",
                    group,
                    lambda: tensor_meta([getattr(q, "tensor", None) for q in queued]),
                    sys._getframe(1),
                )
            if record is None:
                context.__exit__(None, None, None)
                return
            try:
                context.__exit__(None, None, None)
            except BaseException as exc:
                recorder.finish(record, exc)
                raise
            works = [w for w in manager.works if hasattr(w, "is_completed")]
            if works:
                patcher.hook_work_wait()
            recorder.issued(record, point_to_point.AllOf(works) if async_ops and works else None)

        return coalescing

    def _complete_later_or_now(self, record, handle) -> None:
        if handle is not None:
            self.hook_work_wait()
        self.recorder.issued(record, handle)  # isend/irecv/batch: completes when the peer matches it

    def _group_first_wrapper(self, original, api: str, op: str):
        """DDP's C++ helpers (`_broadcast_coalesced(pg, tensors, ...)`): blocking calls taking the group first."""

        def body(args, kwargs, caller):
            group = args[0] if args else kwargs.get("process_group")
            tensors = args[1] if len(args) > 1 else kwargs.get("tensors")
            record = self._begin(op, api, group, lambda: tensor_meta(tensors), caller)
            if record is None:
                return original(*args, **kwargs)
            result = self._finish_on_error(record, original, *args, **kwargs)
            self.recorder.finish(record)
            return result

        wrapper = self._outermost(original, body)
        wrapper.__name__ = getattr(original, "__name__", api)
        return wrapper

    def _rebuild_wrapper(self, original):
        """Reducer._rebuild_buckets broadcasts only the one time it rebuilds; other calls are voided, not counted."""
        recorder = self.recorder

        def body(args, kwargs, caller):
            region = recorder.current_region()
            group = region[3] if region and len(region) > 3 else None
            record = self._begin("broadcast", build.DDP_BUCKET_REBUILD, group, (), caller)
            if record is None:
                return original(*args, **kwargs)
            rebuilt = self._finish_on_error(record, original, *args, **kwargs)
            if rebuilt:
                recorder.finish(record)
            else:
                recorder.void(record)
            return rebuilt

        wrapper = self._outermost(original, body)
        wrapper.__name__ = "_rebuild_buckets"
        return wrapper

    def _region_wrapper(self, original, kind: str, api: str, skip_self: bool):
        """A call that is not itself a collective but issues some: records inside carry it as their region."""
        recorder = self.recorder
        from .sites import frame_site, user_frame

        def wrapper(*args, **kwargs):
            site = frame_site(user_frame(sys._getframe(1)))
            group = getattr(args[0], "process_group", None) if skip_self and args else None
            with recorder.region((kind, site, api, group)):
                return original(*args, **kwargs)

        return wrapper

    def _ddp_forward_wrapper(self, original):
        """DDP.forward as a region; a grad-enabled forward also arms the gradient all-reduce of the next backward."""
        region = self._region_wrapper(original, build.DDP_FORWARD, "DistributedDataParallel.forward", skip_self=True)
        recorder = self.recorder
        import torch

        def forward(ddp, *args, **kwargs):
            result = region(ddp, *args, **kwargs)
            if torch.is_grad_enabled() and getattr(ddp, "require_backward_grad_sync", False):
                recorder.note_ddp_forward(getattr(ddp, "process_group", None))
            return result

        return forward

    def _backward_wrapper(self, original):
        """backward() after a synced DDP forward all-reduces gradients in C++: record it as the collective it is."""
        recorder = self.recorder
        patcher = self

        def backward(*args, **kwargs):
            pg = recorder.take_pending_grad_sync()
            if pg is None:
                return original(*args, **kwargs)
            record = patcher._begin("all_reduce", build.DDP_GRAD_ALLREDUCE, pg, (), sys._getframe(1))
            if record is None:
                return original(*args, **kwargs)
            result = patcher._finish_on_error(record, original, *args, **kwargs)
            recorder.finish(record)
            return result

        return backward


def _subclasses(cls) -> list:
    found, pending = [], list(cls.__subclasses__())
    while pending:
        sub = pending.pop()
        if sub not in found:
            found.append(sub)
            pending.extend(sub.__subclasses__())
    return found


def _runs_on_host(c10d, pg) -> bool:
    """Whether every backend of this group finishes its ops on the host (gloo), so a returned call is a done op."""
    try:
        name = c10d.get_backend(pg)  # "gloo", "nccl", a registered backend's own name ("custom" from the pg itself)
    except Exception:
        try:
            name = pg._get_backend_name()
        except Exception:
            return False
    # "gloo", or "cpu:gloo,cuda:nccl" for a group with a backend per device type
    backends = {part.split(":")[-1].strip().lower() for part in str(name).split(",") if part.strip()}
    return bool(backends) and backends <= HOST_SYNC_BACKENDS
