"""Collectives that completed without matching: fingerprints of the same position compared across ranks (plain data).

Input: {rank: fingerprint document} as watch/fingerprints.py publishes it. Each group's ranks are compared with
the group's lowest rank that has the position. Two findings:
- silent_mismatch: ranks completed one position with a different collective, reduce op, dtype or element count;
- crossed_collectives: ranks passed the same call sites in a different order, fingerprints otherwise equal, so the
  values were exchanged between variables. Ranks reaching one collective from different lines (`if rank == 0:
  broadcast(x) else: broadcast(y)`) are no such thing: only sites every compared rank visits, in other orders,
  among calls of one role (a broadcast's root rotating through the ranks has each issue the root's line in its
  turn), carrying data (barriers do not), with their roots known.
What torch pairs on purpose is not compared: positions inside its Join (a joined rank's shadow collectives), and a
rank's positions past the point where its numbering stops lining up with its peers' (`unaligned_from`). Both are
readings, never acted on (analysis/table.py: the completed stage proves nothing that ends a job).
"""

from __future__ import annotations

from ..catalogue import COLLECTIVES, DATA_FREE, ROOTED
from ..format import build
from .passes import finding

FORMAT = 1
# Ops whose element counts legitimately differ between ranks: all_to_all's splits are each rank's own.
UNEVEN_COUNTS = frozenset({"all_to_all", "barrier"})
# Inside an object collective the payload tensors are sized per rank before they are padded: sizes are torch's own.
OWN_SIZES_REGIONS = frozenset({build.OBJECT_COLLECTIVE})
# Inside torch's Join the joined ranks shadow the others' collectives with unlike ones, on purpose: not compared.
PAIRED_ON_PURPOSE_REGIONS = frozenset({build.TORCH_JOIN})
MAX_SHOWN = 8  # positions a crossed finding lists per rank
SLOTS_PER_POSITION = 2  # fingerprints_of_records: slots (positions and gaps) per position a group completed


def _usable(doc) -> bool:
    return isinstance(doc, dict) and doc.get("v") == FORMAT and isinstance(doc.get("groups"), dict)


def _positions(doc: dict, group: str) -> dict:
    """seq -> (signature doc, DDP step, epoch) of one rank's published positions in `group`."""
    entry = doc["groups"].get(group)
    if not isinstance(entry, dict):
        return {}
    signatures = doc.get("signatures") or {}
    first, ids, steps = entry.get("first", 0), entry.get("ids") or [], entry.get("steps") or []
    # past this position the rank's numbering no longer lines up with its peers' (fingerprints.py: torch's Join)
    unaligned = entry.get("unaligned_from")
    last = unaligned if type(unaligned) is int else None
    found = {}
    for offset, sig in enumerate(ids):
        if last is not None and first + offset >= last:
            break
        signature = signatures.get(str(sig)) if type(sig) is int and sig >= 0 else None
        if isinstance(signature, dict):
            step = steps[offset] if offset < len(steps) else None
            found[first + offset] = (signature, step, entry.get("epoch"))
    return found


def compared_positions(docs: dict) -> int:
    """How many positions the documents have in common, pair by pair, as silent_mismatch compares them: a
    comparison that covered none found nothing because it looked at nothing."""
    return sum(len(rows) for _, _, _, rows in _compared(docs, same_as_reference=True))


def _site_key(signature: dict):
    site = signature.get("site") or {}
    return (site.get("file"), site.get("line")) if site.get("file") else None


def differences(a: dict, b: dict) -> list:
    """What differs between two fingerprints of one position, beside the call site: collective, reduce, dtype,
    count (each compared only where every rank must agree)."""
    if _paired_on_purpose(a, b):
        return []  # torch pairs these on purpose: a joined rank's MAX of int64 meets another's SUM of float32
    if a.get("op") != b.get("op"):
        return ["collective"]
    found = []
    if _root_of(a) is not None and _root_of(b) is not None and _root_of(a) != _root_of(b):
        found.append("root")
    if a.get("reduce") and b.get("reduce") and a["reduce"] != b["reduce"]:
        found.append("reduce")
    dtypes_a, dtypes_b = a.get("dtypes") or [], b.get("dtypes") or []
    if dtypes_a and dtypes_b and len(dtypes_a) == len(dtypes_b) and dtypes_a != dtypes_b:
        found.append("dtype")
    counts_a, counts_b = a.get("counts") or [], b.get("counts") or []
    if (
        counts_a
        and counts_b
        and len(counts_a) == len(counts_b)
        and counts_a != counts_b
        and a.get("op") not in UNEVEN_COUNTS
        and a.get("region") not in OWN_SIZES_REGIONS
        and b.get("region") not in OWN_SIZES_REGIONS
    ):
        found.append("count")
    return found


def _paired_on_purpose(a: dict, b: dict) -> bool:
    """Either call ran inside a region where torch pairs unlike collectives by design (its Join)."""
    return a.get("region") in PAIRED_ON_PURPOSE_REGIONS or b.get("region") in PAIRED_ON_PURPOSE_REGIONS


def _root_of(signature: dict):
    """The root a rooted collective was given (a list when given as a group rank), or None when not kept."""
    root = signature.get("root")
    return tuple(root) if isinstance(root, list) else root if type(root) is int else None


def _compared(docs: dict, same_as_reference: bool = False):
    """(group, reference rank, other rank, [(seq, reference's entry, other's entry)]) for every compared pair.

    A rank whose published positions in a group are the reference's own (the same entry and signatures, as every
    rank's are in a job that runs right) can differ from it nowhere and cross it nowhere: its pair is left out
    unless `same_as_reference` (compared_positions counts it), so an incident's answers from 65,536 ranks are not
    each compared position by position (docs/scale.md)."""
    usable = {rank: doc for rank, doc in docs.items() if _usable(doc)}
    groups = sorted({group for doc in usable.values() for group in doc["groups"]})
    for group in groups:
        logs = _logs(usable, group)
        if len(logs) < 2:
            continue
        reference, *others = sorted(logs)
        for other in others:
            if logs[other] is logs[reference] and not same_as_reference:
                continue
            common = sorted(set(logs[reference]) & set(logs[other]))
            if common:
                yield group, reference, other, [(seq, logs[reference][seq], logs[other][seq]) for seq in common]


def _logs(usable: dict, group: str) -> dict:
    """{rank: its positions in `group`} of the ranks that have some there; a rank whose group entry and signatures
    equal the lowest rank's gets that rank's log itself (the same object), read once."""
    logs: dict = {}
    first = None
    for rank, doc in sorted(usable.items()):
        entry = doc["groups"].get(group)
        if first is not None and entry == first[1] and doc.get("signatures") == first[2]:
            logs[rank] = logs[first[0]]
            continue
        log = _positions(doc, group)
        if log:
            logs[rank] = log
            if first is None:
                first = (rank, entry, doc.get("signatures"))
    return logs


def _side(ranks: list, signature: dict) -> dict:
    return {
        "ranks": sorted(ranks),
        "op": signature.get("op"),
        "reduce": signature.get("reduce"),
        "dtypes": signature.get("dtypes") or [],
        "counts": signature.get("counts") or [],
        "site": signature.get("site"),
        "region": signature.get("region"),
    }


def _culprit_side(sides: list) -> dict:
    """The side fewer ranks are on (a tie: the one without the lowest rank, which is usually the reference)."""
    return min(sides, key=lambda side: (len(side["ranks"]), -min(side["ranks"])))


def silent_mismatch(docs: dict, world_size: int) -> list:
    """A position completed with different collectives, reduce ops, dtypes or element counts: one finding per
    group, at its first such position, with the number of positions the same way mismatched."""
    found: dict = {}
    for group, reference, other, rows in _compared(docs):
        bad = [(seq, mine, theirs, differences(mine[0], theirs[0])) for seq, mine, theirs in rows]
        bad = [row for row in bad if row[3]]
        if not bad:
            continue
        seq, mine, theirs, what = bad[0]
        entry = found.setdefault(group, {"seq": seq, "sides": {}, "what": what, "positions": 0, "formed": mine})
        if seq < entry["seq"]:
            entry.update(seq=seq, sides={}, what=what, formed=mine)
        if seq == entry["seq"]:
            entry["sides"].setdefault(_fingerprint_key(mine[0]), (mine[0], set()))[1].add(reference)
            entry["sides"].setdefault(_fingerprint_key(theirs[0]), (theirs[0], set()))[1].add(other)
        entry["positions"] = max(entry["positions"], len(bad))
    return [_silent_finding(group, entry) for group, entry in sorted(found.items())]


def _fingerprint_key(signature: dict) -> tuple:
    return (
        signature.get("op"),
        signature.get("reduce"),
        tuple(signature.get("dtypes") or ()),
        tuple(signature.get("counts") or ()),
        _site_key(signature),
    )


def _silent_finding(group: str, entry: dict) -> dict:
    sides = [_side(list(ranks), signature) for signature, ranks in entry["sides"].values()]
    sides.sort(key=lambda side: side["ranks"])
    culprit = _culprit_side(sides)
    _, step, epoch = entry["formed"]
    return finding(
        "silent_mismatch",
        culprit["ranks"],
        culprit["site"],
        {"mismatched": [_evidence_row(group, entry["seq"], side) for side in sides]},
        group=group,
        seq=entry["seq"],
        differs=entry["what"],
        sides=sides,
        positions=entry["positions"],
        step=step,
        epoch=epoch,
    )


def _evidence_row(group: str, seq: int, side: dict) -> dict:
    return {
        "ranks": side["ranks"],
        "group": group,
        "seq": seq,
        "op": side["op"],
        "api": side["op"],
        "reduce": side["reduce"],
        "dtypes": side["dtypes"],
        "counts": side["counts"],
        "site": side["site"],
        "description": None,
    }


def crossed_collectives(docs: dict, world_size: int) -> list:
    """Ranks passed the same sites in different orders, fingerprints otherwise equal: values changed variables."""
    findings = []
    for group, reference, other, rows in _compared(docs):
        crossed = [
            (seq, mine, theirs)
            for seq, mine, theirs in rows
            if _may_cross(mine[0], theirs[0])
            and _site_key(mine[0])
            and _site_key(theirs[0])
            and _site_key(mine[0]) != _site_key(theirs[0])
        ]
        # Crossed among calls of one role: a rooted call's sites are compared among positions of the same root (a
        # root that rotates has each rank issue the root's line in its turn, another line the others: by design)
        by_role: dict = {}
        for row in crossed:
            by_role.setdefault(_root_of(row[1][0]), []).append(row)
        for same_role in by_role.values():
            mine_sites = {_site_key(m[0]) for _, m, _ in same_role}
            their_sites = {_site_key(t[0]) for _, _, t in same_role}
            if mine_sites == their_sites and len(mine_sites) >= 2:  # the same lines in another order
                findings.append(_crossed_finding(group, reference, other, same_role))
                break
    return _one_per_group(findings)


def _may_cross(a: dict, b: dict) -> bool:
    """Whether two calls at one position could have exchanged values between variables: the same call otherwise
    (no difference), carrying data (a barrier carries none), and for a rooted call its root known on both sides."""
    if _paired_on_purpose(a, b) or differences(a, b) or a.get("op") in DATA_FREE:
        return False
    return a.get("op") not in ROOTED or (_root_of(a) is not None and _root_of(b) is not None)


def _crossed_finding(group: str, reference: int, other: int, crossed: list) -> dict:
    shown = crossed[:MAX_SHOWN]
    orders = [
        {"ranks": [reference], "sites": [m[0].get("site") for _, m, _ in shown]},
        {"ranks": [other], "sites": [t[0].get("site") for _, _, t in shown]},
    ]
    seq, first, _ = crossed[0]
    _, step, epoch = first
    return finding(
        "crossed_collectives",
        [reference, other],
        shown[0][2][0].get("site"),
        {"orders": orders},
        group=group,
        seqs=[s for s, _, _ in shown],
        positions=len(crossed),
        orders=orders,
        op=first[0].get("op"),
        dtypes=first[0].get("dtypes") or [],
        counts=first[0].get("counts") or [],
        step=step,
        epoch=epoch,
    )


def _one_per_group(findings: list) -> list:
    """One crossed finding per group: the pair seen first (ranks compared with the same reference repeat it)."""
    seen, kept = set(), []
    for item in findings:
        if item["facts"]["group"] not in seen:
            seen.add(item["facts"]["group"])
            kept.append(item)
    return kept


# ---------------------------------------------------------------- a mismatch the backend answered with an abort


def _collective_frame(stacks) -> tuple:
    """(the torch.distributed call, the user's frame that made it) on the main thread of a stack, or (None, None)."""
    main = next((stack for stack in stacks or () if isinstance(stack, dict) and stack.get("main")), None)
    frames = [f for f in (main or {}).get("frames") or () if isinstance(f, dict)]
    call = next(
        (
            f
            for f in reversed(frames)
            if str(f.get("file", "")).endswith("distributed_c10d.py") and f.get("function") in COLLECTIVES
        ),
        None,
    )
    if call is None:
        return None, None
    below = frames[: frames.index(call)]
    return call, next((f for f in reversed(below) if not f.get("internal")), None)


def _failed_record(state: dict) -> dict | None:
    """The survivor's collective that failed when its peer vanished (its newest failed record), or, when none has
    failed yet, the collective it still waits in: the backend's abort closes the peer's connections, but this rank's
    call raises only once its own side notices, and torchrun's SIGTERM, sent as soon as the peer exits, can come first
    (seen beside a CPU-bound neighbour: 1 of 3 whole-suite runs)."""
    inflight = [r for r in state.get("inflight") or () if isinstance(r, dict) and not r.get("p2p")]
    records = inflight + [r for r in state.get("recent") or () if isinstance(r, dict) and not r.get("p2p")]
    failed = [r for r in records if r.get("state") == "failed"]
    chosen = failed or [r for r in inflight if r.get("state") == "in_flight"]
    return max(chosen, key=lambda r: r.get("start") or 0.0) if chosen else None


def mismatch_crash(silent: dict, live: dict, grace: float) -> list:
    """A peer the backend aborted (its fault file: 'Fatal Python error: Aborted') inside a collective, while a
    surviving rank's collective at that point failed: gloo aborts the side that receives more bytes than it
    expects. Both lines are named; the dead rank's sizes are not known (it died inside the call)."""
    failed = [(rank, _failed_record(state)) for rank, state in sorted(live.items())]
    survivors = [(rank, record) for rank, record in failed if record is not None]
    findings = []
    for rank, view in sorted(silent.items()):
        fault = view.get("fault") or {}
        call, user = _collective_frame((view.get("last_state") or {}).get("stacks"))
        if not fault or call is None or not survivors:
            continue
        last = (view.get("last_state") or {}).get("last_seq") or {}
        group = survivors[0][1].get("group")
        crashed = {
            "rank": rank,
            "op": COLLECTIVES[call["function"]].op,
            "api": call["function"],
            "site": user and {k: user.get(k) for k in ("file", "line", "function")},
            "error": str(fault.get("error"))[:200],
            "last_seq": last.get(group),
        }
        others = [
            {
                "ranks": [r],
                "op": rec.get("op"),
                "group": rec.get("group"),
                "seq": rec.get("seq"),
                "shapes": rec.get("shapes") or [],
                "dtypes": rec.get("dtypes") or [],
                "site": rec.get("site"),
                "error": str(rec.get("error") or "")[:300],
            }
            for r, rec in survivors
        ]
        findings.append(
            finding(
                "mismatch_crash",
                [rank],
                crashed["site"],
                {
                    "mismatched": [_crash_row(crashed, others[0])] + [_survivor_row(o) for o in others],
                    "fault_file": fault.get("file"),
                },
                crashed=crashed,
                survivors=others,
            )
        )
    return findings


def _crash_row(crashed: dict, survivor: dict) -> dict:
    return {
        "ranks": [crashed["rank"]],
        "group": survivor["group"],
        "seq": survivor["seq"],
        "op": crashed["op"],
        "api": crashed["api"],
        "shapes": [],
        "dtypes": [],
        "site": crashed["site"],
        "description": None,
    }


def _survivor_row(survivor: dict) -> dict:
    return {
        "ranks": survivor["ranks"],
        "group": survivor["group"],
        "seq": survivor["seq"],
        "op": survivor["op"],
        "api": survivor["op"],
        "shapes": survivor["shapes"],
        "dtypes": survivor["dtypes"],
        "site": survivor["site"],
        "description": None,
    }


def fingerprints_of_records(records: list, rank: int) -> dict:
    """A fingerprint document (the shape watch/fingerprints.py publishes) from completed records: what
    `ddpwatch report --flight-recorder` compares. The Flight Recorder keeps no reduce op: a SUM against a MAX is
    invisible there."""
    groups: dict = {}
    signatures: dict = {}
    for record in records:
        if record.get("p2p") or record.get("state") != "completed" or type(record.get("seq")) is not int:
            continue
        counts = [_elements(shape) for shape in record.get("shapes") or ()]
        signature = {
            "op": record.get("op"),
            "reduce": None,
            "dtypes": list(record.get("dtypes") or ()),
            "counts": counts,
            "site": record.get("site"),
            "region": (record.get("region") or {}).get("kind"),
        }
        key = repr(sorted(signature.items()))
        sig_id = signatures.setdefault(key, (len(signatures), signature))[0]
        groups.setdefault(record["group"], {})[record["seq"]] = sig_id
    docs = {}
    for group, by_seq in groups.items():
        # One slot per position from `first` to `last`, as watch/fingerprints.py publishes them. A dump's positions
        # in a group are consecutive, so the slots are as many as the records; a crafted sequence number (2**62
        # beside 1 and 2) must not make billions of them: at most SLOTS_PER_POSITION per position, the newest.
        last = max(by_seq)
        first = min(seq for seq in by_seq if seq > last - SLOTS_PER_POSITION * len(by_seq))
        docs[group] = {
            "first": first,
            "ids": [by_seq.get(seq, -1) for seq in range(first, last + 1)],
            "steps": [],
            "epoch": None,
        }
    return {
        "v": FORMAT,
        "n": 1,
        "rank": rank,
        "groups": docs,
        "signatures": {str(i): signature for i, signature in signatures.values()},
    }


def _elements(shape) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count
