"""The one catalogue of torch.distributed's collectives: what gets patched, what lint flags, what the FR calls it.

Adding a collective is one row here: patching (wrappers.py), `ddpwatch lint` (lint.py), the Flight Recorder reader
(flight_recorder.py) and the functional-collective recorder (functional.py) all read these tables. No torch import.
"""

from __future__ import annotations

from typing import NamedTuple

from .format import build

# Peers whose send/recv counts a snapshot carries (a ring or a pipeline has a few): the recorder keeps no more, and
# analysis/p2p.py reads a pair missing from a table below this size as none.
P2P_COUNTS_KEPT = 64


class Collective(NamedTuple):
    """One public function of torch.distributed."""

    op: str  # the canonical op it performs, the name reports use
    tensors: tuple = ()  # the parameters that hold its input tensors (recorded: shapes and dtypes)
    group_at: int | None = None  # the position of its group argument (lint: a group passed means a subgroup op)
    kind: str = "collective"  # collective | object (issues tensor collectives inside) | group (creates a group)


COLLECTIVE, OBJECT, GROUP_CREATION = "collective", "object", "group"

COLLECTIVES = {
    "broadcast": Collective("broadcast", ("tensor",), 2),
    "all_reduce": Collective("all_reduce", ("tensor",), 2),
    "all_reduce_coalesced": Collective("all_reduce", ("tensors",), 2),
    "reduce": Collective("reduce", ("tensor",), 3),
    "all_gather": Collective("all_gather", ("tensor",), 2),
    "all_gather_single": Collective("all_gather", ("input_tensor",), 2),
    "all_gather_into_tensor": Collective("all_gather", ("input_tensor",), 2),
    "_all_gather_base": Collective("all_gather", ("input_tensor",), 2),
    "all_gather_coalesced": Collective("all_gather", ("input_tensor_list",), 2),
    "gather": Collective("gather", ("tensor",), 3),
    "scatter": Collective("scatter", ("tensor",), 3),
    "reduce_scatter": Collective("reduce_scatter", ("output",), 3),
    "reduce_scatter_single": Collective("reduce_scatter", ("input",), 3),
    "reduce_scatter_tensor": Collective("reduce_scatter", ("input",), 3),
    "_reduce_scatter_base": Collective("reduce_scatter", ("input",), 3),
    "all_to_all_single": Collective("all_to_all", ("input",), 4),
    "all_to_all": Collective("all_to_all", ("input_tensor_list",), 2),
    "barrier": Collective("barrier", (), 0),
    "monitored_barrier": Collective("barrier", (), 0),
    # Object collectives pickle, then issue tensor collectives: those are what gets recorded, inside this region.
    "all_gather_object": Collective("all_gather", (), 2, OBJECT),
    "broadcast_object_list": Collective("broadcast", (), 2, OBJECT),
    "gather_object": Collective("gather", (), 3, OBJECT),
    "scatter_object_list": Collective("scatter", (), 3, OBJECT),
    "send_object_list": Collective("send", (), 2, OBJECT),
    "recv_object_list": Collective("recv", (), 2, OBJECT),
    # Every rank of the default group must call it (unless use_local_synchronization=True): lint only.
    "new_group": Collective("new_group", (), None, GROUP_CREATION),
}

# Calls whose tensors may differ in size from rank to rank in a correct program: all_to_all's splits are each rank's
# own, and the list forms of all_gather / reduce_scatter take uneven sizes (NCCL). Their sizes are never compared.
SIZES_PER_RANK = frozenset({"all_to_all", "all_to_all_single", "all_gather", "all_gather_coalesced", "reduce_scatter"})
# Collectives with a root (src or dst): the root's call and the others' are different roles, often different lines.
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})
# Collectives that carry no data: nothing can be exchanged between variables, whatever lines issue them.
DATA_FREE = frozenset({"barrier"})
# Collectives that take a reduce op (canonical names): one rank reducing with MAX where the others SUM completes
# every call and computes wrong numbers (analysis/silent.py), so the op is part of what is compared.
REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter"})

# Point-to-point: name -> (canonical op, parameter naming the peer).
P2P = {
    "send": ("send", "dst"),
    "recv": ("recv", "src"),
    "isend": ("send", "dst"),
    "irecv": ("recv", "src"),
}
# The DDP calls under torch.distributed that issue several c10d ops (one per bucket) and are one record each, under
# either recorder (the python recorder wraps them as one op; the flight feed folds their entries): name -> op.
# Beside them, on torch.distributed.Reducer, the bucket rebuild, and torch.autograd.backward's gradient all-reduce.
DDP_MULTI_OP_CALLS = {build.DDP_BUFFER_BROADCAST: "broadcast", build.DDP_VERIFY_PARAMS: "all_gather"}
REDUCER_REBUILD = "_rebuild_buckets"

BATCH_P2P = "batch_isend_irecv"
COALESCING_MANAGER = "_coalescing_manager"

# torch.distributed._functional_collectives (DTensor, tensor parallel): returns at once, waited by wait_tensor().
FUNCTIONAL_COLLECTIVES = {
    "broadcast": "broadcast",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_tensor": "all_gather",
    "all_gather_tensor_autograd": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_single_autograd": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_single_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_autograd": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_single_autograd": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "all_to_all_single_autograd": "all_to_all",
    "permute_tensor": "all_to_all",
}

# The backends' own op names (the Flight Recorder's profiling_name, "gloo:allreduce") that are not a public name.
BACKEND_OP_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "allgather_base": "all_gather",
    "all_gather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "sendrecv": "send",
}


def tensor_collectives() -> dict:
    """name -> Collective for the calls that are themselves one collective (patched as such)."""
    return {name: entry for name, entry in COLLECTIVES.items() if entry.kind == COLLECTIVE}


def reducing_collectives() -> tuple:
    """The public names whose collective takes a reduce op (REDUCING)."""
    return tuple(name for name, entry in tensor_collectives().items() if entry.op in REDUCING)


def object_collectives() -> tuple:
    return tuple(name for name, entry in COLLECTIVES.items() if entry.kind == OBJECT)


def canonical_op(name: str) -> str:
    """Any spelling of an op (public API, backend, Flight Recorder) -> the name reports use; an unknown one as it is.

    The one op-name function: live records, the Flight Recorder reader and the pairing of the two all use it."""
    entry = COLLECTIVES.get(name)
    if entry is not None:
        return entry.op
    if name in BACKEND_OP_NAMES or not isinstance(name, str) or not name.startswith("_"):
        return BACKEND_OP_NAMES.get(name, name)
    known = canonical_op(name.lstrip("_"))  # the backends' private spellings: "_allgather_base"
    return known if known != name.lstrip("_") else name
