"""The English of collectives that completed without matching (silent_mismatch, crossed_collectives)."""

from __future__ import annotations

from ..format import build

_WHAT = {
    "collective": "different collectives",
    "reduce": "different reduce ops",
    "dtype": "different dtypes",
    "count": "different element counts",
}

_FIXES = {
    "dtype": (
        "Give the tensor one dtype on every rank before the collective: build it with an explicit dtype "
        "(`torch.tensor(values, dtype=torch.float32)`); a tensor made from Python ints on one rank and floats "
        "on another, or a rank-conditional `.half()` or autocast, differs here. The backend moved the bytes "
        "as they were, so the receiving ranks read floats as integers (or the reverse)."
    ),
    "count": (
        "Reduce the same number of elements on every rank at this point: per-rank logging helpers must not "
        "share a position while reducing different things (reduce each in its own call that every rank "
        "makes, or pad to one size). On NCCL this corrupts memory or hangs; gloo aborts the smaller side."
    ),
    "reduce": (
        "Use one reduce op on every rank: take it from configuration every rank shares, never from a "
        "rank-local setting; each rank got a different result (SUM on some, MAX on others)."
    ),
    "collective": (
        "Issue the same collective at this point on every rank: a branch on rank, data or configuration "
        "changes which collective runs; both completed, so the results are garbage."
    ),
}


def _tensors_text(side: dict) -> str:
    counts, dtypes = side.get("counts") or [], side.get("dtypes") or []
    if not counts:
        return ""
    parts = [f"{count} {dtype}" for count, dtype in zip(counts, dtypes)]
    return " of " + ", ".join(parts)


def side_text(side: dict) -> str:
    """'all_reduce (sum) of 4 float32 at train.py:12 in log_loss()'."""
    reduce = f" ({side['reduce']})" if side.get("reduce") else ""
    return f"{side.get('op')}{reduce}{_tensors_text(side)} at {build.format_site(side.get('site'))}"


def _formed_text(facts: dict) -> str:
    step, epoch = facts.get("step"), facts.get("epoch")
    when = []
    if step:  # 0: before any DDP training step (or a job without DDP), which says nothing
        when.append(f"{step} DDP steps")
    if epoch is not None:
        when.append(f"epoch {epoch}")
    return f", first after {' in '.join(when)}" if when else ""


def _positions_text(facts: dict) -> str:
    count = facts.get("positions") or 1
    return "1 position" if count == 1 else f"{count} positions"


def silent_mismatch(facts: dict, ranks_text) -> tuple:
    what = " and ".join(_WHAT.get(item, item) for item in facts["differs"])
    sides = "; ".join(f"{ranks_text(side['ranks'])}: {side_text(side)}" for side in facts["sides"])
    summary = (
        f"Collectives completed without matching: at group {facts['group']} seq {facts['seq']} the ranks "
        f"issued {what}: {sides}. Nothing hung, so nothing stopped: the values these collectives returned are "
        f"wrong ({_positions_text(facts)} so far{_formed_text(facts)})."
    )
    fix = " ".join(_FIXES[item] for item in facts["differs"] if item in _FIXES)
    return summary, fix or _FIXES["collective"]


def crossed_collectives(facts: dict, ranks_text) -> tuple:
    orders = "; ".join(
        f"{ranks_text(order['ranks'])}: " + ", then ".join(build.short_site(site) for site in order["sites"])
        for order in facts["orders"]
    )
    summary = (
        f"The ranks passed the same collectives in different orders (group {facts['group']}, seq "
        f"{facts['seqs'][0]}, {_positions_text(facts)}{_formed_text(facts)}): {orders}. Every one of them "
        f"matched in op, shape and dtype ({facts['op']}{_tensors_text(facts)}), so nothing failed: the values "
        "were exchanged between variables, each rank holding in one what the others reduced as another."
    )
    fix = (
        "Issue collectives in one order every rank shares: iterate metric dictionaries in sorted key order "
        "(`for name in sorted(metrics)`), or stack the values into one tensor and reduce it once; an order taken "
        "from a set, a rank-local dict, or a branch that reorders calls differs between ranks."
    )
    return summary, fix


def _survivor_text(survivor: dict) -> str:
    shapes = ", ".join(
        f"{'x'.join(map(str, shape)) or 'scalar'} {dtype}"
        for shape, dtype in zip(survivor.get("shapes") or [], survivor.get("dtypes") or [])
    )
    tensors = f" of {shapes}" if shapes else ""
    return f"{survivor.get('op')}{tensors} at {build.format_site(survivor.get('site'))}"


def mismatch_crash(facts: dict, ranks_text) -> tuple:
    crashed = facts["crashed"]
    survivors = "; ".join(
        f"{ranks_text(s['ranks'])} ran {_survivor_text(s)} (group {s['group']} seq {s['seq']})"
        for s in facts["survivors"]
    )
    summary = (
        f"Rank {crashed['rank']} was aborted by the backend ({crashed['error']}) inside {crashed['api']} at "
        f"{build.format_site(crashed['site'])}, while {survivors}, whose call then failed. A backend aborts a "
        "rank in the middle of a collective when the ranks' calls do not match (gloo: \"Received data size "
        "doesn't match expected size\", the receiving side got more bytes than its tensor holds): these two "
        f"lines met at the same position. Rank {crashed['rank']}'s own sizes are not known: it died inside "
        "the call (its stack came from its fault file)."
    )
    fix = (
        "Make every rank issue the same collective, with the same element count and dtype, at this point: two "
        "helpers that each reduce something of their own (a loss on one rank, a histogram on another) must not "
        "meet at one position; reduce each in a call every rank makes, or pad to one size. On NCCL the same bug "
        "corrupts memory or hangs instead."
    )
    return summary, fix
