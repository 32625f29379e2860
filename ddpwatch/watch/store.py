"""Sharing rank state through the job's own c10d key-value store: JSON under a ddpwatch prefix, never pickle."""

from __future__ import annotations

import datetime
import json
import logging
import re
import secrets
import time
from typing import Any, Mapping

from ..format import bounded, documents, validate
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


def _decode_all(keys: list, values: list) -> dict:
    """{key: doc}: the values decoded as one JSON array (one parser call instead of thousands), or one by one when
    one of them is torn, foreign or would build too much, which is then left out rather than trusted. Every doc is
    a JSON object: ddpwatch writes nothing else there, so anything else is someone else's and left out too."""
    raw = [bytes(value) for value in values]
    small = all(len(value) <= MAX_VALUE_BYTES for value in raw)
    if len(raw) > 1 and small and _within_budget(b"".join(raw)):
        try:
            docs = json.loads(b"[" + b",".join(raw) + b"]")
            if len(docs) == len(keys) and all(isinstance(doc, dict) for doc in docs):  # else a value was foreign
                return dict(zip(keys, docs))
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nesting deeper than the parser
            pass
    docs = {}
    for key, value in zip(keys, raw):
        if len(value) > MAX_VALUE_BYTES or not _within_budget(value):
            continue
        try:
            doc = json.loads(value.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(doc, dict):
            docs[key] = doc
    return docs


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
        raw = self._call(self._store.compare_set, key, ABSENT, ABSENT)
        value = _as_counter(raw)
        if value is None:
            self._malformed[key] = bytes(raw)
        else:
            self._last_good[key] = value
            self._malformed.pop(key, None)
        return value

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
        # Per slice of keys: one round trip when every key of the slice is there (the usual case), per-key checks
        # only when some are missing. Slices, because one TCPStore multi_get of 16,384 keys took 14 s where 32
        # slices of 512 took 0.4 s (benchmarks/scale.py).
        if not keys:
            return {}
        present, values = [], []
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
        docs = _decode_all(present, values)
        if len(docs) < len(present):
            log_once(
                self.logged,
                "left-out",
                "ddpwatch: left out %d value(s) at ddpwatch's keys that are not JSON objects ddpwatch could have "
                "written (torn, too big, or someone else's; said once)",
                len(present) - len(docs),
            )
        return docs

    def read_now(self, keys: list, max_bytes: int) -> tuple:
        """({key: doc} of the keys there now, [(key, why)] of values left out): one compare_set round trip per key,
        which never waits for a key (a multi_get waits the store's timeout for one that someone deleted since its
        check) and never changes one. A value over `max_bytes` is left out unparsed; one that is not a JSON object
        is left out too."""
        docs, dropped = {}, []
        for key in keys:
            raw = bytes(self._call(self._store.compare_set, key, ABSENT, ABSENT))
            if raw == ABSENT:
                continue
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


def _by_rank(docs: dict, ranks: dict, world_size: int) -> dict:
    """{rank: doc} of `docs` ({key: doc}) whose doc names the rank of its key (`ranks`: {key: rank}) and passes the
    report format's checks of a rank state (validate.published_state); anything else, torn or someone else's, is
    left out."""
    return {
        ranks[key]: doc
        for key, doc in docs.items()
        if doc.get("rank") == ranks[key] and validate.published_state(doc, world_size)
    }


# What the leader reads of every rank each interval: a rank's state without its history (recent records, site counts).
# Which ranks wait where, for how long, under which condition, is all a verdict needs; the history only names the
# finding, and the leader reads it from each rank's full answer once an incident starts. 2.9 KiB -> about 0.5 KiB.
POSITION_LEAVES_OUT = frozenset(
    {"recent", "site_counts", "last_seq", "ops_recorded", "format_version", "world_size", "published_at", "run"}
)


def position(state: Mapping[str, Any]) -> dict:
    return {key: value for key, value in state.items() if key not in POSITION_LEAVES_OUT}


LEADER = 0  # the rank that watches the others (while it lives: see PeerTracker.leader_silent)
# The incident number counts in units of 2**32 of the one counter, the ranks waiting below it: a job of up to 4
# billion ranks reads both with one add(key, 0) per round, where two counters cost two round trips.
INCIDENT_UNIT = 1 << 32


def _with_beat(body: str, beat) -> str:
    """A position's text (`body`: its JSON object without the closing brace) with `beat` as its last key."""
    if type(beat) is not int:
        return body + "}"
    return f'{body}{"," if len(body) > 1 else ""}"beat":{beat}}}'


def _split_counters(value: int) -> tuple:
    """(ranks waiting, latest incident) of the counter's value; anyone can add to it, so both are clamped to >= 0."""
    incident, waiting = divmod(max(0, value), INCIDENT_UNIT)
    return waiting, incident


class JobProtocol:
    """Every key the ranks of one job share, and every round trip on them: the watchdog speaks only through this.

    Heartbeats: pos/<r> (each rank's position, see `position`: every round; a running rank's as last built, with a
    new beat: see publish_beat) beside state/<r> (its whole state: every round while it makes no progress, else
    every few seconds), and leader_beat (rank 0's beat number, written with its position: a few bytes the waiting
    ranks read to know it is alive). One counter, `counters`, holds the ranks
    blocked past grace in its low bits and the incident number in its high bits, so that one round trip (an add of
    0) tells a rank both. Incidents: claim/<fingerprint> (first writer wins), then under incident/<n>/: info, rank/<r>
    and count (the answers), native/<r> (py-spy's stacks), verdict, acks.
    """

    POLL_S = 0.05  # between two reads of a counter someone else is filling

    def __init__(self, store: StateStore, world_size: int, relay=None):
        self.store = store
        self.world_size = world_size
        # watch/node.py's NodeRelay where this rank's node relays: while the rank runs, its round trips are its
        # node leader's (a file each way); waiting or exiting, it speaks to the store itself
        self.relay = relay
        self._relayed = False  # this round's publish went to the relay
        self._wants: list = []  # the partners whose completed positions this rank reads (the leader reads them)
        self._relayed_fps: dict = {}  # {rank: document} as the node's leader last read them
        self._put_last: dict = {}  # key -> text, what this rank last put for its node as its leader
        self._keys: dict = {}  # parts -> key, for the keys of every round: building them was a tenth of its work
        # (rank, the JSON text of its last published position without its beat and "}")
        self._position: tuple[int, str] | None = None
        self._counters = (0, 0)  # the last (ranks waiting, latest incident) read: what a malformed counter reads as
        self._leader_beat = 0
        self.logged: set = set()  # the documents left out, said once per kind (the watchdog logs nothing here)

    @property
    def stamp(self) -> str:
        return self.store.stamp

    @property
    def job_token(self) -> str:
        return self.store.job_token

    @property
    def run(self) -> str:
        """The run's identity, "<stamp>-<token>": the job's start and its random token (one per attempt)."""
        token = getattr(self.store, "job_token", "")  # a store stand-in (tests) may have none
        return f"{self.store.stamp}-{token}" if token else ""

    # ----- heartbeats -----
    def publish(
        self, rank: int, state: Mapping[str, Any], whole: bool = True, fingerprints: dict | None = None
    ) -> None:
        """This rank's position, and its state when `whole` (else the last whole state stands), in one round trip;
        rank 0's carries its beat number to leader_beat too (an integer: an add of 0 reads it). The position's text
        is kept: publish_beat() sends it again with a new beat."""
        shown = position(state)
        beat = shown.pop("beat", None)
        body = documents.dumps(shown)[:-1]  # "{...", its closing brace off: the beat goes last, then "}"
        docs: dict[str, object] = {self._key("pos", rank): _with_beat(body, beat)}
        if whole:
            docs[self._key("state", rank)] = state
        self._add_fingerprints(docs, rank, fingerprints)
        self._add_leader_beat(docs, rank, beat)
        first = self._position is None or self._position[0] != rank  # its first: in the store at once, pid and host
        self._position = (rank, body)
        self._put(docs, self.relay is not None and not first and self.relay.carries(state))
        if self.relay is not None and state.get("status") == "exited":
            self.relay.close()  # an exited rank relays no more: the node's next rank leads
            self.relay = None

    def publish_beat(self, rank: int, beat: int, fingerprints: dict | None = None) -> bool:
        """The last position this rank published, again, with a new beat: one round trip, nothing built or encoded.
        For a rank that runs (see StateReader.beat_is_enough): its position says where a blocked rank stands, and of a
        running one only that it runs, which still holds. False when this rank has published no position yet."""
        if self._position is None or self._position[0] != rank:
            return False
        docs: dict[str, object] = {self._key("pos", rank): _with_beat(self._position[1], beat)}
        self._add_fingerprints(docs, rank, fingerprints)
        self._add_leader_beat(docs, rank, beat)
        self._put(docs, self.relay is not None)
        return True

    def _put(self, docs: dict, relayed: bool) -> None:
        """This round's documents: to the relay while the rank runs (its file is written every round, so that its
        node sees it live either way), else to the store."""
        self._relayed = relayed
        if self.relay is not None:
            try:
                self.relay.stage(docs, self._wants, direct=not relayed)
            except OSError as exc:  # the node's folder is gone or full: this rank speaks to the store itself
                self._relayed = False
                log_once(self.logged, "relay", "ddpwatch: the node relay failed (%s); this rank uses the store", exc)
        if not self._relayed:
            self.store.put_many(docs)

    def _add_fingerprints(self, docs: dict, rank: int, fingerprints: dict | None) -> None:
        """The rank's completed positions (watch/fingerprints.py), in the round's one put, when they changed."""
        if fingerprints is not None:
            docs[self._key("fp", rank)] = fingerprints

    def fingerprints(self, ranks) -> dict:
        """{rank: fingerprint document} of `ranks` whose document is there and passes its checks (size first, then
        validate.fingerprint_problem, then that it names its own rank); one that fails is left out, said once. One
        round trip per rank (read_now: a key someone deleted is not waited for); a rank reads one partner a round."""
        ranks = list(ranks)
        if self._relayed and len(ranks) <= MAX_RELAYED_PARTNERS:  # its partners', which its node's leader read
            self._wants = sorted(ranks)
            return {r: self._relayed_fps[r] for r in ranks if r in self._relayed_fps}
        return self._direct_fingerprints(ranks)

    def _direct_fingerprints(self, ranks: list) -> dict:
        keys = {self._key("fp", r): r for r in ranks}
        docs, dropped = self.store.read_now(list(keys), FINGERPRINTS_MAX_BYTES)
        found = {}
        for key, doc in docs.items():
            problem = validate.fingerprint_problem(doc, self.world_size)
            if problem is None and doc.get("rank") != keys[key]:
                problem = f"it names rank {doc.get('rank')!s:.20}"
            if problem is None:
                found[keys[key]] = doc
            else:
                dropped.append((key, problem))
        for key, why in dropped:
            self._left_out("fp", keys[key], why)
        return found

    def _left_out(self, kind: str, rank: int, why: str) -> None:
        """One line, once per kind of document, for a value at ddpwatch's key that is not one ddpwatch wrote."""
        log_once(
            self.logged,
            f"left-out-{kind}",
            "ddpwatch: left out the %s document at rank %d's key (%s); someone else wrote it, or it was torn. The "
            "other ranks' are still compared; this is said once",
            kind,
            rank,
            visible(why),
        )

    def _add_leader_beat(self, docs: dict, rank: int, beat) -> None:
        if rank == LEADER and type(beat) is int:
            docs[self._key("leader_beat")] = beat

    def _key(self, *parts) -> str:
        key = self._keys.get(parts)
        if key is None:
            if len(self._keys) > 2 * self.world_size + 64:
                self._keys.clear()  # bounded: a read of every rank's key passes here too
            key = self._keys[parts] = self.store.key(*parts)
        return key

    def states(self, ranks=None) -> dict:
        """{rank: state} of the ranks (default: all) that have published; a missing one is skipped, never waited for."""
        return self._read_by_rank("state", ranks)

    def positions(self, ranks=None) -> dict:
        """{rank: position}: what the leader reads every interval (a fifth of the bytes of the states)."""
        return self._read_by_rank("pos", ranks)

    def with_history(self, views: dict) -> dict:
        """{rank: view} with each view laid over that rank's last whole state (one read for all of them): what was
        seen of a rank last (its position, a busy stand-in) wins; its whole state adds the history (recent records,
        site counts) a report shows."""
        wholes = self.states(sorted(views)) if views else {}
        return {rank: {**(wholes.get(rank) or {}), **view} for rank, view in views.items()}

    def _read_by_rank(self, kind: str, ranks) -> dict:
        ranks = range(self.world_size) if ranks is None else ranks
        keys = {self._key(kind, r): r for r in ranks}
        return self._checked(kind, self.store.get_many(list(keys)), keys)

    def _checked(self, kind: str, docs: dict, keys: dict) -> dict:
        """_by_rank(), saying once when a value there was left out."""
        found = _by_rank(docs, keys, self.world_size)
        if len(found) < len(docs):
            rank = min(keys[key] for key in docs if keys[key] not in found)
            self._left_out(kind, rank, "not a rank state of this job: a field of the wrong type or out of bounds")
        return found

    def counters(self) -> tuple:
        """(ranks waiting, the latest incident's number), in one round trip (through the node's leader while this
        rank runs under a relay); a value there that is not a counter (someone else wrote it) reads as no change."""
        if self.relay is not None:
            try:
                if self.relay.leader() == self.relay.rank:
                    return self._node_round()
                if self._relayed:
                    return self._take_post(self.relay.posted())
            except OSError as exc:
                log_once(self.logged, "relay", "ddpwatch: the node relay failed (%s); this rank uses the store", exc)
        value = self.store.counter(self._key("counters"))
        if value is not None:
            self._counters = _split_counters(value)
        return self._counters

    def _node_round(self) -> tuple:
        """The node leader's round: its running ranks' documents the job needs in one put (watch/node.py says
        which), the counters and the partners' documents read once for all of them, and posted for the others."""
        staged = self.relay.staged()
        docs = self.relay.to_put(staged, self._counters[0] > 0, self.store.namespace)
        if docs:
            self.store.put_many(docs)
            self.relay.put_done(docs)
        value = self.store.counter(self._key("counters"))
        if value is not None:
            self._counters = _split_counters(value)
        self._relayed_fps = self._direct_fingerprints(self.relay.wanted(staged, self.world_size))
        self.relay.post(value, self._relayed_fps)
        return self._counters

    def _take_post(self, post: dict) -> tuple:
        """The counters and partners' documents the node's leader left (an earlier round's while it has not posted)."""
        value, self._relayed_fps = self.relay.read_post(post, self.world_size)
        if value is not None:
            self._counters = _split_counters(value)
        return self._counters

    def change_waiting(self, delta: int) -> int:
        """Add `delta` to the number of ranks waiting; returns the new number (one round trip either way)."""
        return _split_counters(self.store.add(self._key("counters"), delta))[0]

    def waiting(self) -> int:
        return self.counters()[0]

    def leader_beat(self) -> int:
        """Rank 0's last published beat number (0 before its first publish; the last one read while what is there
        is not a number)."""
        value = self.store.counter(self._key("leader_beat"))
        if value is not None:
            self._leader_beat = value
        return self._leader_beat

    # ----- incidents -----
    def claim(self, fingerprint: str) -> bool:
        """True for the one rank that claims this fingerprint first: it writes the report, the others do not."""
        return self.store.add(self.store.key("claim", fingerprint), 1) == 1

    def release(self, fingerprint: str) -> None:
        """Give a claim back (a report not written after all): the next rank to see the same verdict may write it."""
        self.store.add(self.store.key("claim", fingerprint), -1)

    def open_incident(self, info: dict) -> int:
        number = _split_counters(self.store.add(self._key("counters"), INCIDENT_UNIT))[1]
        self.store.put(self.store.key("incident", number, "info"), info)
        return number

    def latest_incident(self) -> int:
        return self.counters()[1]

    def incident_info(self, number: int) -> dict:
        return self.store.get(self.store.key("incident", number, "info")) or {}

    def contribute(self, number: int, rank: int, doc: dict) -> None:
        self.store.put(self.store.key("incident", number, "rank", rank), doc)
        self.store.add(self.store.key("incident", number, "count"), 1)

    def contribute_native(self, number: int, rank: int, doc: dict) -> None:
        self.store.put(self.store.key("incident", number, "native", rank), doc)

    def collect(self, number: int, deadline: float, answering: int | None = None) -> dict:
        """{rank: answer} for incident `number`, once `answering` ranks (default: every rank) have answered or at
        `deadline` (monotonic)."""
        count = self.store.key("incident", number, "count")
        answering = self.world_size if answering is None else answering
        while time.monotonic() < deadline and (self.store.counter(count) or 0) < answering:
            time.sleep(self.POLL_S)
        keys = {self.store.key("incident", number, "rank", r): r for r in range(self.world_size)}
        return self._checked("answer", self.store.get_many(list(keys)), keys)

    def natives(self, number: int, ranks) -> dict:
        """{rank: native stacks} of those of `ranks` whose py-spy answer for incident `number` is in."""
        keys = {self.store.key("incident", number, "native", r): r for r in ranks}
        return {keys[key]: doc for key, doc in self.store.get_many(list(keys)).items()}

    def post_verdict(self, number: int, verdict: dict) -> None:
        self.store.put(self.store.key("incident", number, "verdict"), verdict)

    def verdict(self, number: int) -> dict | None:
        return self.store.get(self.store.key("incident", number, "verdict"))

    def ack(self, number: int) -> None:
        self.store.add(self.store.key("incident", number, "acks"), 1)

    def acks(self, number: int) -> int:
        return self.store.counter(self.store.key("incident", number, "acks")) or 0
