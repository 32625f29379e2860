"""The watchdog's client of the job's c10d key-value store: its own connection, short timeouts, JSON only."""

from __future__ import annotations

import datetime
import json
import logging
import re
import secrets
import time
from typing import Any

from ..format import bounded, documents
from ..logonce import log_once
from ..terminal import visible

log = logging.getLogger("ddpwatch")

PREFIX = "ddpwatch/v1"
STAMP = re.compile(r"\d{8}-\d{6}")  # what agree() takes for the job's stamp (time.strftime's "%Y%m%d-%H%M%S")
JOB_TOKEN = re.compile(r"[0-9a-f]{16}")  # ... and for its token (secrets.token_hex(8))
MULTI_GET_SLICE = 512
# Anyone who reaches the store's port can write a value there: what one read may build is budgeted before parsing
# (bounded.json_build_estimate), as the file loaders do. A rank's full incident answer is tens of KiB and a
# 16,384-rank read of positions about 8 MiB (4.6 estimated bytes per byte); 25 MB of `{}` would build 1.3 GB.
READ_BUILT_FLOOR = 64 * 2**20
READ_BUILT_PER_BYTE = 12
# compare_set(key, ABSENT, ABSENT) reads a key in one round trip without waiting for it and without changing it: the
# value there, or ABSENT when there is none. A counter is read so, never with add(key, 0): TCPStore's add on a value
# that is not an integer (anyone on the port can write one) closes the connection, which ended ddpwatch for the job.
ABSENT = b"\x00ddpwatch: absent"
QUICK_WAIT_S = 0.3  # read_together's longest wait for a key deleted since it was seen (the node leader's round)
COUNTER_RANGE = (-(2**63), 2**63)  # what the store's add can hold (a 64-bit integer)
# A rank's fingerprint document: 96 positions per group and their distinct signatures, a few KiB (8 groups with a
# distinct line per position: 166 KiB). A bigger value is not one ddpwatch wrote and is not parsed: issue 41's probe
# wrote 5.7 MiB there, and a rank went from 265 to 648 MiB.
FINGERPRINTS_MAX_BYTES = 512 * 2**10
MAX_RELAYED_PARTNERS = 8  # a rank reads one partner per group; a longer list (a finding's read of all) is direct


class StoreUnavailable(RuntimeError):
    """The store stopped answering; the watchdog stops publishing rather than raise into training."""


MAX_VALUE_BYTES = 8 * 2**20  # one value at a ddpwatch key, hundreds of times a full answer: a bigger one is not parsed


def _within_budget(value: bytes) -> bool:
    return bounded.json_build_estimate(value) <= READ_BUILT_FLOOR + READ_BUILT_PER_BYTE * len(value)


def _as_counter(raw) -> int | None:
    """The integer a counter's raw value holds (0 when absent), or None when it is not one the store can add to."""
    raw = bytes(raw)
    if raw == ABSENT:
        return 0
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if COUNTER_RANGE[0] <= value < COUNTER_RANGE[1] else None


def buildable(raw: list) -> list:
    """Which of the raw values may be parsed: each within MAX_VALUE_BYTES, and what parsing them all would build
    within the budget (counted once for them all; value by value only when they do not fit together)."""
    small = [len(value) <= MAX_VALUE_BYTES for value in raw]
    if all(small) and _within_budget(b"".join(raw)):
        return small
    return [fit and _within_budget(value) for fit, value in zip(small, raw)]


def _decode_all(keys: list, values: list) -> dict:
    """{key: doc} of the values that decode (decode_each); the others are left out rather than trusted."""
    return {key: doc for key, doc in zip(keys, decode_each(values)) if doc is not None}


def decode_each(values: list) -> list:
    """[doc or None] of each value: all decoded as one JSON array (one parser call instead of thousands), or one by
    one when one of them is torn, foreign or would build too much, which is then None. Every doc is a JSON object:
    ddpwatch writes nothing else there, so anything else is someone else's and None too."""
    raw = [bytes(value) for value in values]
    fits = buildable(raw)
    if len(raw) > 1 and all(fits):
        try:
            docs = json.loads(b"[" + b",".join(raw) + b"]")
            if len(docs) == len(raw) and all(isinstance(doc, dict) for doc in docs):  # else a value was foreign
                return docs
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nesting deeper than the parser
            pass
    return [_decoded(value) if fit else None for value, fit in zip(raw, fits)]


def _decoded(value: bytes) -> dict | None:
    try:
        doc = json.loads(value.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


class StateStore:
    """The watchdog's view of the store: its own client (a clone), short timeouts, non-blocking reads only."""

    def __init__(self, store, namespace: str, timeout_s: float = 5.0):
        self._store = store
        self.namespace = f"{PREFIX}/{namespace}"
        self.stamp = ""  # the job's start, every rank's (agree): names its local dump folders
        self.job_token = ""  # random, every rank's (agree): names its fault files, apart from other jobs' of the user
        self._timeout_s = timeout_s
        self._last_good: dict = {}  # key -> the last integer read there (what a malformed counter is put back to)
        self._malformed: dict = {}  # key -> the raw value last read there that was not a counter
        self.logged: set = set()  # the values left out, said once
        self.seen: set = set()  # keys read_together has found there (it waits for none that never was)
        self._quick_client: Any = None  # read_together's client, its timeout QUICK_WAIT_S
        try:
            store.set_timeout(datetime.timedelta(seconds=timeout_s))
        except Exception:
            pass

    @classmethod
    def from_default_group(cls, generation_key: str, world_size: int, timeout_s: float = 5.0) -> "StateStore":
        """A clone of the default group's store (the watchdog must not share the training thread's client)."""
        import torch.distributed.distributed_c10d as c10d

        base = c10d._get_default_store()
        try:
            client = base.clone()  # type: ignore[attr-defined]  # newer torch's; its stubs leave it out
        except Exception:
            client = base  # older torch: share the client; every call below is short and non-blocking
        try:
            client.set_timeout(datetime.timedelta(seconds=timeout_s))
        except Exception:
            pass
        # Re-arming inside one job (destroy + init again) must not read the last generation's keys.
        try:
            arms = client.add(f"{PREFIX}/arms/{generation_key}", 1)
        except Exception as exc:  # torch's FakeStore, and other stores that cannot count: nothing to publish in
            raise StoreUnavailable(f"the job's store cannot add ({type(exc).__name__}: {str(exc)[:120]})") from None
        state_store = cls(client, f"{generation_key}/g{(arms - 1) // max(world_size, 1)}", timeout_s)
        state_store.stamp = state_store.agree("stamp", time.strftime("%Y%m%d-%H%M%S"), STAMP)
        state_store.job_token = state_store.agree("job", secrets.token_hex(8), JOB_TOKEN)
        return state_store

    def agree(self, name: str, proposal: str, shape: re.Pattern) -> str:
        """One value every rank gets: the first proposal to reach the store wins (compare-and-set on an empty key).

        Used for names that must be the same on every rank even after the store is gone (local dump folders, fault
        files): they become parts of paths, so a value there that is not of `shape` (anyone on the port can write
        the key before the ranks arm) is not used; this rank's own proposal is, said once.
        """
        try:
            value = bytes(self._store.compare_set(self.key(name), "", proposal)).decode("utf-8", "replace")
        except Exception:
            return proposal
        if value and not shape.fullmatch(value):
            log.warning(
                "ddpwatch: the store's %r key holds %s, not a value ddpwatch writes there; using this rank's own",
                name,
                visible(repr(value[:40])),
            )
            return proposal
        return value or proposal

    def key(self, *parts) -> str:
        return "/".join((self.namespace,) + tuple(str(p) for p in parts))

    def _call(self, method, *args):
        try:
            return method(*args)
        except Exception as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from None

    def put(self, key: str, doc: dict) -> None:
        self._call(self._store.set, key, documents.dumps(doc))

    def put_many(self, docs: dict) -> None:
        """{key: doc} in one round trip where the store can (multi_set), else one set per key. An int goes as its
        digits (what add() reads), a str as the JSON text it is: neither calls the encoder."""
        keys = list(docs)
        values = [
            doc if type(doc) is str else str(doc) if type(doc) is int else documents.dumps(doc) for doc in docs.values()
        ]  # a str: JSON text already (publish_beat)
        if hasattr(self._store, "multi_set"):
            self._call(self._store.multi_set, keys, values)
        else:
            for key, value in zip(keys, values):
                self._call(self._store.set, key, value)

    def add(self, key: str, amount: int) -> int:
        """The store's add, on a counter made sound first: a value someone wrote there that is not an integer is put
        back to the last one read (TCPStore closes the connection of an add on it). Should the add fail all the same
        (the value was changed meanwhile), this client reconnects once, mends the value and adds again."""
        bad = self._malformed.pop(key, None)
        if bad is not None:
            self._mend(key, bad)
        try:
            return int(self._store.add(key, amount))
        except Exception as exc:
            failure = exc
        self._reconnect(failure)
        raw = self._call(self._store.compare_set, key, ABSENT, ABSENT)
        if _as_counter(raw) is None:
            self._mend(key, raw)
        return int(self._call(self._store.add, key, amount))

    def counter(self, key: str) -> int | None:
        """The integer at `key` (0 when absent), read without waiting and without failing on the value: None when
        what is there is not a counter, which callers take as "no change"."""
        return self.counter_of(key, self._call(self._store.compare_set, key, ABSENT, ABSENT))

    def _mend(self, key: str, bad: bytes) -> None:
        """Put the counter at `key` back to its last good value, if it still holds `bad` (another rank may have)."""
        self._call(self._store.compare_set, key, bad, str(self._last_good.get(key, 0)))

    def _reconnect(self, failure: BaseException) -> None:
        """A new client for this one, whose connection the store may have closed (clone: same address, same 5 s
        timeout, so a store that is gone is known within it); StoreUnavailable when that fails too."""
        try:
            client = self._store.clone()
            client.set_timeout(datetime.timedelta(seconds=self._timeout_s))
        except Exception:
            raise StoreUnavailable(f"{type(failure).__name__}: {failure}") from None
        self._store = client

    def exists(self, key: str) -> bool:
        return bool(self._call(self._store.check, [key]))

    def get_many(self, keys: list) -> dict:
        """{key: doc} for the keys that exist; a missing key is skipped, never waited for."""
        present, values = self.raw_many(keys)
        docs = _decode_all(present, values)
        if len(docs) < len(present):
            self.left_out(len(present) - len(docs))
        return docs

    def left_out(self, count: int) -> None:
        log_once(
            self.logged,
            "left-out",
            "ddpwatch: left out %d value(s) at ddpwatch's keys that are not JSON objects ddpwatch could have "
            "written (torn, too big, or someone else's; said once)",
            count,
        )

    def raw_many(self, keys: list) -> tuple:
        """([key], [raw value]) of the keys that exist, in their order; a missing key is skipped, never waited for."""
        # Per slice of keys: one round trip when every key of the slice is there (the usual case), per-key checks
        # only when some are missing. Slices, because one TCPStore multi_get of 16,384 keys took 14 s where 32
        # slices of 512 took 0.4 s (benchmarks/scale.py).
        present: list = []
        values: list = []
        for start in range(0, len(keys), MULTI_GET_SLICE):
            chunk = list(keys[start : start + MULTI_GET_SLICE])
            everything = bool(self._call(self._store.check, chunk))
            found = chunk if everything else [key for key in chunk if self.exists(key)]
            if not found:
                continue
            present.extend(found)
            if hasattr(self._store, "multi_get"):
                values.extend(self._call(self._store.multi_get, found))
            else:
                values.extend(self._call(self._store.get, key) for key in found)
        return present, [bytes(value) for value in values]

    def raw_now(self, keys: list) -> dict:
        """{key: raw value} of the keys there now: one compare_set round trip per key, which never waits for a key
        (a multi_get waits the store's timeout for one that someone deleted since its check) and never changes one;
        documents_of parses what it read."""
        found = {}
        for key in keys:
            raw = bytes(self._call(self._store.compare_set, key, ABSENT, ABSENT))
            if raw != ABSENT:
                found[key] = raw
        return found

    def read_together(self, keys: list) -> dict:
        """{key: raw value} of `keys` in one round trip once each has been seen there (a multi_get on a client of
        its own whose timeout is QUICK_WAIT_S: a key someone deleted since costs that wait, once); before, or after
        such a wait, raw_now's one compare_set per key, which never waits."""
        if self.seen.issuperset(keys):
            try:
                return dict(zip(keys, (bytes(raw) for raw in self._quick().multi_get(keys))))
            except Exception:  # deleted since (someone on the port), or no second client: one by one, and see again
                self.seen.difference_update(keys)
        found = self.raw_now(keys)
        self.seen.update(found)
        return found

    def _quick(self):
        if self._quick_client is None:
            self._quick_client = self._store.clone()
            self._quick_client.set_timeout(datetime.timedelta(seconds=QUICK_WAIT_S))
        return self._quick_client

    def counter_of(self, key: str, raw) -> int | None:
        """counter()'s reading of a raw value read elsewhere (read_together)."""
        value = _as_counter(raw)
        if value is None:
            self._malformed[key] = bytes(raw)
        else:
            self._last_good[key] = value
            self._malformed.pop(key, None)
        return value

    @staticmethod
    def documents_of(raws: dict, max_bytes: int) -> tuple:
        """({key: doc}, [(key, why)]) of raw values: one over `max_bytes` left out unparsed, one that is not a JSON
        object left out too."""
        docs, dropped = {}, []
        for key, raw in raws.items():
            if len(raw) > max_bytes:
                dropped.append((key, f"{len(raw)} bytes, over the {max_bytes} a document of this kind may have"))
                continue
            found = _decode_all([key], [raw])
            if key in found:
                docs[key] = found[key]
            else:
                dropped.append((key, "not a JSON object ddpwatch could have written"))
        return docs, dropped

    def get(self, key: str):
        return self.get_many([key]).get(key)
