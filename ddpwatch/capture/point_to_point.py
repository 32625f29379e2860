"""The point-to-point wrappers: send, recv, isend, irecv and batch_isend_irecv recorded with peer and tag."""

from __future__ import annotations

import inspect

from .. import catalogue
from ..format import build
from .arguments import arg, param_index
from .tensors import tensor_meta

OPS_KEPT = 64  # the ops of one batch_isend_irecv kept in its record: a pipeline's batch is a handful
ASYNC_P2P = frozenset({"isend", "irecv", "batch_isend_irecv"})  # the P2P calls that return a Work to the user


def p2p_wrapper(patcher, original, api: str, op: str, peer_param: str):
    """send/recv/isend/irecv: one record, its peer a rank of the default group, its tag kept."""
    signature = inspect.signature(original)
    group_i = param_index(signature, "group")
    peer_i = param_index(signature, peer_param)
    tensor_i = param_index(signature, "tensor")
    tag_i = param_index(signature, "tag")
    group_peer_param = "group_dst" if peer_param == "dst" else "group_src"
    group_peer_i = param_index(signature, group_peer_param)

    def body(args, kwargs, caller):
        group = arg(args, kwargs, group_i, "group")
        peer = global_peer(
            patcher._c10d,
            group,
            arg(args, kwargs, peer_i, peer_param),
            arg(args, kwargs, group_peer_i, group_peer_param),
        )
        record = patcher._begin(
            op, api, group, lambda: tensor_meta(arg(args, kwargs, tensor_i, "tensor")), caller, peer=peer
        )
        if record is None:
            return original(*args, **kwargs)
        record.p2p = (_tag(arg(args, kwargs, tag_i, "tag", 0)), None, origin_of(caller))
        result = patcher._finish_on_error(record, original, *args, **kwargs)
        patcher._complete_later_or_now(record, result if hasattr(result, "is_completed") else None)
        return result

    return patcher._outermost(original, body)


def batch_wrapper(patcher, original):
    """batch_isend_irecv: one record for the batch (the isend/irecv calls inside it are not recorded again), with
    each op's direction, peer and tag; done when all its Works are."""

    def body(args, kwargs, caller):
        ops = args[0] if args else kwargs.get("p2p_op_list") or []
        first = ops[0] if ops else None
        record = patcher._begin(
            "batch_p2p",
            catalogue.BATCH_P2P,
            getattr(first, "group", None),
            lambda: tensor_meta([getattr(p, "tensor", None) for p in ops]),
            caller,
            peer=-2,
        )
        if record is None:
            return original(*args, **kwargs)
        record.p2p = (None, batch_ops(patcher._c10d, ops), origin_of(caller))
        works = patcher._finish_on_error(record, original, *args, **kwargs)
        pending = [w for w in works or () if hasattr(w, "is_completed")]
        patcher._complete_later_or_now(record, AllOf(pending) if pending else None)
        return works

    return patcher._outermost(original, body)


# A library whose P2P schedule the user does not write: the report speaks of its schedule, not of send and recv.
ORIGINS = (("/torch/distributed/pipelining/", "torch.distributed.pipelining"),)
ORIGIN_DEPTH = 4  # frames looked at above the call (pipelining: _batch_p2p <- _step_microbatches <- step)


def origin_of(caller) -> str | None:
    """The library that issued this P2P op, from the few frames above it; None for the user's own send/recv."""
    frame, depth = caller, 0
    while frame is not None and depth < ORIGIN_DEPTH:
        name = frame.f_code.co_filename.replace("\\", "/")
        for marker, origin in ORIGINS:
            if marker in name:
                return origin
        frame, depth = frame.f_back, depth + 1
    return None


def global_peer(c10d, group, peer, group_peer) -> int:
    """The peer as a rank of the default group (`dst`/`src` are; `group_dst`/`group_src` number the group's own
    ranks); -1 for "any source" (recv with no src). Never raises: a peer it cannot read is -1."""
    try:
        if peer is None and group_peer is not None:
            if group is None:
                return int(group_peer)
            return int(c10d.get_global_rank(group, int(group_peer)))
        return -1 if peer is None else int(peer)
    except Exception:
        return -1


def batch_ops(c10d, ops) -> tuple:
    """((op, global peer, tag), ...) of a batch_isend_irecv list, at most OPS_KEPT of them."""
    described = []
    for p2p_op in list(ops)[:OPS_KEPT]:
        function = getattr(p2p_op, "op", None)
        name = getattr(function, "__ddpwatch_original__", function)
        kind = "recv" if getattr(name, "__name__", "").endswith("recv") else "send"
        peer = global_peer(
            c10d, getattr(p2p_op, "group", None), getattr(p2p_op, "peer", None), getattr(p2p_op, "group_peer", None)
        )
        described.append((kind, peer, _tag(getattr(p2p_op, "tag", 0))))
    return tuple(described)


def _tag(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class AllOf:
    """One handle over several Work objects (batch_isend_irecv): completed when all are."""

    __slots__ = ("works",)

    def __init__(self, works):
        self.works = works

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def p2p_fields(record, waited: frozenset) -> dict:
    """What a point-to-point record adds to its plain data: tag, the batch's ops, where it came from, whether the
    call returned a Work to the user (async) and whether a thread is blocked in that Work's wait() now: an isend
    left in flight while the rank computes is not a wait. `waited`: ids of the Works threads wait on now."""
    tag, ops, origin = getattr(record, "p2p", None) or (None, None, None)
    fields: dict = {"tag": tag}
    if ops is not None:
        fields["ops"] = [{"op": op, "peer": peer, "tag": op_tag} for op, peer, op_tag in ops]
    if origin:
        fields["origin"] = origin
    if record.api in ASYNC_P2P:
        fields.update(async_fields(record, waited))
    return fields


def async_fields(record, waited: frozenset, waiting: bool = False) -> dict:
    """`async`, and whether a thread waits on the op now: in wait() on its Work (or a batch's part; `waited`: ids of
    the Works threads wait on now), or, `waiting`, in wait_tensor() on a functional collective's output."""
    work = record.work
    parts = (getattr(work, "works", None) or (work,)) if work is not None else ()
    on_it = waiting or any(id(part) in waited for part in parts)
    return {"async": True, "waited": record.state == build.IN_FLIGHT and on_it}
