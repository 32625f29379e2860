"""Each completed collective's fingerprint (op, reduce op, dtypes, sizes, call site), per position, off the hot path.

The watchdog thread reads the recorder's ring once a round and files every collective completed since the last
round under its (group, sequence number); the training thread does nothing more than it did (the wrapper stores
the reduce op on the record, one attribute). Published in a compact form (a table of distinct fingerprints, then
one index per position), the ranks' logs are compared by analysis/silent.py: collectives that completed but did
not match (a float32 against an int32 of the same byte size, SUM against MAX, two tensors exchanged between
variables) leave no hang behind, only wrong numbers.
"""

from __future__ import annotations

import collections
import itertools
import logging

from .. import analysis
from ..analysis import silent
from ..catalogue import SIZES_PER_RANK
from ..format import build
from ..capture import loaders
from ..capture.sites import resolve_site

log = logging.getLogger("ddpwatch")

FORMAT = 1  # the published document's own version: analysis reads `v` and refuses others
KEEP = 2048  # positions kept per group (this rank's own log): a peer that publishes late is still compared
PUBLISH = 96  # positions per group a round publishes: the newest; more than most jobs complete in a round
MAX_GROUPS = 64  # groups followed (a job that makes a group per step must not grow this forever)
MAX_SIGNATURES = 4096  # distinct fingerprints remembered; past it the table starts again (the log keeps its ids)


def _reduce_name(op) -> str | None:
    """'sum' for ReduceOp.SUM / RedOpType.SUM, and for a ReduceOp object (`ReduceOp(ReduceOp.MAX)`, a premultiplied
    sum with its factor) the name of its type: str() of those holds a memory address, different on every rank.
    None when the collective takes no reduce op, or the op has no name to compare."""
    if op is None:
        return None
    name = getattr(op, "name", None) or getattr(getattr(op, "op", None), "name", None)
    return str(name).rsplit(".", 1)[-1].lower() if name else None


def _root(record):
    """The root a rooted collective was given, as every rank spells it: the global rank, else ("group", rank in
    the group); None for an op without a root, or one whose root was not kept (the flight recorder keeps none)."""
    root = getattr(record, "root", None)
    if not isinstance(root, tuple) or len(root) != 2:
        return None
    rank, group_rank = root
    if type(rank) is int:
        return rank
    return ["group", group_rank] if type(group_rank) is int else None


def _count(shape) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def signature_of(record) -> tuple:
    """What must agree across ranks at one position, from a record: (op, reduce op, dtypes, element counts, raw
    site, region kind, root). Built on the watchdog thread; the record's values are the raw ones the wrapper kept."""
    tensors = record.tensors or ()
    dtypes = tuple(str(dtype).replace("torch.", "") for _, dtype in tensors)
    # sizes each rank chooses for itself (all_to_all splits, an uneven all_gather list) are not published
    counts = () if record.api in SIZES_PER_RANK else tuple(_count(shape) for shape, _ in tensors)
    region = record.region[0] if record.region else None
    root = _root(record)
    return (
        record.op,
        _reduce_name(getattr(record, "reduce", None)),
        dtypes,
        counts,
        record.site,
        region,
        tuple(root) if isinstance(root, list) else root,
    )


class FingerprintLog:
    """This rank's completed positions, per group: seq -> (fingerprint id, DDP step, epoch)."""

    def __init__(self, recorder, numbered_by_torch: bool = False):
        self.recorder = recorder
        # the flight feed's records (numbered by torch's own count, its feed refreshed by the watchdog before each
        # collect) rather than the python recorder's wrappers'
        self.numbered_by_torch = numbered_by_torch
        self._log: dict = {}  # group -> OrderedDict(seq -> (signature id, step, epoch))
        self._ids: dict = {}  # signature -> id
        self._signatures: dict = {}  # id -> signature
        self._next_id = itertools.count()
        self._waiting: list = []  # records in flight at the last round: filed once they complete
        self._newest = None  # the ring's newest record at the last round
        self._documents = 0
        self.changed = False  # a position was filed since the last publish
        # group -> the first position filed from inside torch's Join, under the python recorder: from there on the
        # joined ranks shadow collectives a Python patch never sees (the C++ Reducer's) with ones it does, so this
        # rank's positions no longer line up with its peers' (the flight recorder numbers by torch's own count)
        self._unaligned: dict = {}

    def collect(self) -> None:
        """File every collective completed since the last round (the ring's records newer than the newest one seen
        last round, and the ones that were in flight then); never blocks the training thread (the ring is read as
        the watchdog reads it anyway). The ring, not the progress count, says what is new: the flight feed hands
        over finished records in reads of its own (its refresh, made before this), apart from the progress it counts."""
        ring = list(self.recorder.ring)  # one C-level copy: the training thread may append while this reads
        newest = ring[-1] if ring else None
        if newest is self._newest and not self._waiting:
            return
        fresh = []
        for record in reversed(ring):
            if record is self._newest:
                break
            fresh.append(record)
        self._newest = newest
        step, epoch = self.recorder.ddp_steps, _epoch()
        pending = []
        for record in self._waiting + fresh[::-1]:
            if record.peer is not None or record.state == build.UNTRACKED:
                continue  # point-to-point pairs are matched by analysis/p2p.py; an untracked op never ends
            if record.state == build.IN_FLIGHT:
                pending.append(record)
            elif record.state == build.COMPLETED:
                self._file(record, step, epoch)
        self._waiting = list(dict.fromkeys(pending))[-64:]

    def group_names(self) -> list:
        return list(self._log)

    def _file(self, record, step: int, epoch) -> None:
        group = self._log.get(record.group)
        if group is None:
            if len(self._log) >= MAX_GROUPS:
                return
            group = self._log[record.group] = collections.OrderedDict()
        if record.seq in group:
            return
        signature = signature_of(record)
        region = signature[5]
        if region == build.TORCH_JOIN and not self.numbered_by_torch:
            self._unaligned.setdefault(record.group, record.seq)
        group[record.seq] = (self._id_of(signature), step, epoch)
        if len(group) > KEEP:
            group.popitem(last=False)
        self.changed = True

    def _id_of(self, signature: tuple) -> int:
        found = self._ids.get(signature)
        if found is None:
            if len(self._ids) >= MAX_SIGNATURES:
                self._forget_signatures()
            found = self._ids[signature] = next(self._next_id)
            self._signatures[found] = signature
        return found

    def _forget_signatures(self) -> None:
        """Keep only the signatures the log still names (ids are never reused: a counter hands them out)."""
        named = {entry[0] for group in self._log.values() for entry in group.values()}
        self._signatures = {i: sig for i, sig in self._signatures.items() if i in named}
        self._ids = {sig: i for i, sig in self._signatures.items()}

    def document(self, per_group: int = PUBLISH, since: dict | None = None) -> dict:
        """The newest `per_group` positions of each group, as plain data (see analysis/silent.py for the reading):
        {"v", "groups": {group: {"first": seq, "ids": [...], "steps": [...], "epoch": e, "unaligned_from": seq}},
        "signatures": {id: {op, reduce, dtypes, counts, site, region, root}}}; positions missing from a run (a voided
        record) are -1; `unaligned_from`, where present, the first position past which this rank's numbering does not
        line up with its peers' (torch's Join under the python recorder). `since` ({group: seq}, an incident's
        ask): those groups from that position on, as far as the log keeps them, however many that is."""
        self._documents += 1  # its number: a peer's document read again unchanged is not compared again
        groups, used = {}, set()
        for name, log in list(self._log.items()):
            seqs = list(itertools.islice(reversed(log), per_group))[::-1]
            if not seqs:
                continue
            asked = (since or {}).get(name)
            if type(asked) is int and asked < seqs[0]:
                seqs = [seq for seq in log if seq >= asked]  # at most KEEP: the log keeps no more
            first = seqs[0]
            ids, steps, epochs = [-1] * (seqs[-1] - first + 1), [None] * (seqs[-1] - first + 1), []
            for seq in seqs:
                sig, step, epoch = log[seq]
                ids[seq - first], steps[seq - first] = sig, step
                epochs.append(epoch)
                used.add(sig)
            groups[name] = {"first": first, "ids": ids, "steps": steps, "epoch": epochs[-1]}
            if name in self._unaligned:
                groups[name]["unaligned_from"] = self._unaligned[name]
        return {
            "v": FORMAT,
            "n": self._documents,
            "groups": groups,
            "signatures": {str(i): self._signature_doc(i) for i in sorted(used)},
        }

    def _signature_doc(self, sig_id: int) -> dict:
        op, reduce, dtypes, counts, raw_site, region, root = self._signatures[sig_id]
        site = resolve_site(raw_site)
        return {
            "op": op,
            "reduce": reduce,
            "dtypes": list(dtypes),
            "counts": list(counts),
            "site": site and build.site(*site),
            "region": region,
            "root": list(root) if isinstance(root, tuple) else root,
        }


def _epoch():
    """The epoch the loader iterated last is in (1-based), or None when no DataLoader is tracked."""
    try:
        read = loaders.read()
    except Exception:
        return None
    return max((entry["epochs"] for entry in read), default=None)


class MismatchCheck:
    """The watchdog's part for collectives that completed without matching: once a round, file this rank's new
    positions, hand their document to the round's publish, and compare it with the one peer each group is compared
    with (its lowest other rank: one store read a round, for any number of ranks)."""

    def __init__(self, log: FingerprintLog, rank: int, world_size: int, groups):
        self.log = log
        self.rank = rank
        self.world_size = world_size
        self.groups = groups  # () -> {group name: its ranks, None for the default group}
        self._mine: dict | None = None  # this rank's document as last published
        self._compared: tuple = ()  # (mine, theirs) of the last comparison: nothing new, nothing to compare
        self.said_compared = False  # the first comparison that covered positions was logged (DEBUG)

    def outgoing(self) -> dict | None:
        """This round's document, when a position was filed since the last one (else None: the last one stands)."""
        self.log.collect()
        if not self.log.changed:
            return None
        self.log.changed = False
        self._mine = dict(self.log.document(), rank=self.rank)
        return self._mine

    def _say_compared(self, docs: dict) -> None:
        """(DEBUG only, once.) That a comparison covered positions: a check that found nothing had something to
        look at (tests/test_real_silent.py reads it)."""
        covered = silent.compared_positions({r: d for r, d in docs.items() if isinstance(d, dict)})
        if covered:
            self.said_compared = True
            others = sorted(r for r in docs if r != self.rank)
            log.debug("ddpwatch: rank %d compared %d completed positions with rank(s) %s", self.rank, covered, others)

    def partners(self) -> list:
        """The lowest other rank of each group this rank completed positions in (ranks unknown: the whole world)."""
        found, groups = set(), self.groups()
        for ranks in [groups.get(name) for name in self.log.group_names()]:
            members = range(self.world_size) if ranks is None else ranks
            others = [r for r in members if r != self.rank]
            if others:
                found.add(min(others))
        return sorted(found)

    def look(self, job, reported: set):
        """(an Assessment of a completed mismatch not in `reported`, which it joins, and {rank: a stand-in state
        holding that rank's positions}) or None; reads the partners' documents."""
        if self._mine is None or self.world_size < 2:
            return None
        docs = job.fingerprints(self.partners())
        key = (self._mine.get("n"), tuple(sorted((r, d.get("n")) for r, d in docs.items() if isinstance(d, dict))))
        if not docs or key == self._compared:
            return None
        self._compared = key
        docs[self.rank] = self._mine
        if not self.said_compared and log.isEnabledFor(logging.DEBUG):
            self._say_compared(docs)
        assessment = analysis.completed_mismatches({r: {"fingerprints": d} for r, d in docs.items()}, self.world_size)
        if assessment.verdict is None or assessment.fingerprint in reported:
            return None
        reported.add(assessment.fingerprint)
        # Every rank's positions, read once now: a rank that does not answer within the incident's short wait
        # still stands in with them, so the report groups all ranks by what they called, not only the pair compared
        docs.update({rank: doc for rank, doc in job.fingerprints(range(self.world_size)).items() if rank != self.rank})
        return assessment, {rank: {"rank": rank, "fingerprints": doc} for rank, doc in docs.items()}


MAX_ASKED = 8  # groups an incident may ask about (analysis/confirm.py asks about a few)


def asked_positions(info) -> dict:
    """{group: seq} an incident's info asks each answer to hold (a peer wrote it: only names and numbers pass)."""
    asked = info.get("since") if isinstance(info, dict) else None
    if not isinstance(asked, dict):
        return {}
    return dict(
        list(
            (group, seq)
            for group, seq in asked.items()
            if isinstance(group, str) and len(group) <= 256 and type(seq) is int and 0 <= seq < 2**63
        )[:MAX_ASKED]
    )
