"""The job protocol: every key the ranks of one job share in its c10d store, and every round trip on them."""

from __future__ import annotations

import time
from typing import Any, Mapping

from ..format import build, validate
from ..logonce import log_once
from ..terminal import visible
from . import position_text
from .state_store import (  # noqa: F401 - the store's names, read from here by the watchdog's parts and tests
    ABSENT,
    FINGERPRINTS_MAX_BYTES,
    JOB_TOKEN,
    MAX_RELAYED_PARTNERS,
    MAX_VALUE_BYTES,
    PREFIX,
    STAMP,
    StateStore,
    StoreUnavailable,
)


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


def _with_beat(own: str, beat, where: str) -> str:
    """A position's text (position_text.texts: the rank's own fields without the closing brace, then where it
    stands) with `beat` as the last of the rank's own fields."""
    if type(beat) is not int:
        return own + (where[1:] if own == "{" and where.startswith(",") else where)
    return f'{own}{"," if len(own) > 1 else ""}"beat":{beat}{where}'


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
        self._keys: dict = {}  # parts -> key, for the keys of every round: building them was a tenth of its work
        # (rank, the two parts of its last published position's text, without its beat: position_text.texts)
        self._position: tuple[int, str, str] | None = None
        self._where_put = ""  # where this rank stood (its position's text from "inflight" on) when it last put its own
        self._posted_beat: int | None = None  # rank 0's beat number from the post the last counters() read took
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
        own, where = position_text.texts(shown)  # "{...", then ',"inflight":...}': the beat goes between them
        docs: dict[str, object] = {self._key("pos", rank): _with_beat(own, beat, where)}
        if whole:
            docs[self._key("state", rank)] = state
        self._add_fingerprints(docs, rank, fingerprints)
        self._add_leader_beat(docs, rank, beat)
        first = self._position is None or self._position[0] != rank  # its first: in the store at once, pid and host
        self._position = (rank, own, where)
        blocked = self.relay is not None and self.relay.blocked(state)
        relayed = self.relay is not None and not first and self.relay.carries(state, blocked, where == self._where_put)
        self._put(docs, relayed, blocked=relayed and blocked)
        if not self._relayed:
            self._where_put = where
        if self.relay is not None and state.get("status") == build.EXITED:
            self.relay.close()  # an exited rank relays no more: the node's next rank leads
            self.relay = None

    def publish_beat(self, rank: int, beat: int, fingerprints: dict | None = None) -> bool:
        """The last position this rank published, again, with a new beat: one round trip, nothing built or encoded.
        For a rank that runs (see StateReader.beat_is_enough): its position says where a blocked rank stands, and of a
        running one only that it runs, which still holds. False when this rank has published no position yet."""
        if self._position is None or self._position[0] != rank:
            return False
        docs: dict[str, object] = {self._key("pos", rank): _with_beat(self._position[1], beat, self._position[2])}
        self._add_fingerprints(docs, rank, fingerprints)
        self._add_leader_beat(docs, rank, beat)
        self._put(docs, self.relay is not None)
        return True

    def _put(self, docs: dict, relayed: bool, blocked: bool = False) -> None:
        """This round's documents: to the relay while the node's leader carries them (NodeRelay.carries; its file is
        written every round, so that its node sees it live either way), else to the store."""
        self._relayed = relayed
        if self.relay is not None:
            try:
                self.relay.stage(docs, self._wants, direct=not relayed, blocked=blocked)
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
        round trip per rank (raw_now: a key someone deleted is not waited for); a rank reads one partner a round;
        under a relay, its node's leader reads them for it."""
        ranks = list(ranks)
        if self._relayed and len(ranks) <= MAX_RELAYED_PARTNERS:  # its partners', which its node's leader read
            self._wants = sorted(ranks)
            return {r: self._relayed_fps[r] for r in ranks if r in self._relayed_fps}
        return self._direct_fingerprints(ranks)

    def _direct_fingerprints(self, ranks: list, raws: dict | None = None) -> dict:
        """{rank: document} of `ranks` read now (or found in `raws`, {key: raw value}, read already)."""
        keys = {self._key("fp", r): r for r in ranks}
        raws = self.store.raw_now(list(keys)) if raws is None else raws
        docs, dropped = self.store.documents_of({k: v for k, v in raws.items() if k in keys}, FINGERPRINTS_MAX_BYTES)
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
        """{rank: position}: what the leader reads every interval (a fifth of the bytes of the states), read as
        position_text reads it: where the ranks stand decoded and checked once per distinct text of it."""
        ranks = range(self.world_size) if ranks is None else ranks
        keys = {self._key("pos", r): r for r in ranks}
        present, raws = self.store.raw_many(list(keys))
        read = position_text.read(raws, self.world_size)
        found = {keys[key]: doc for key, doc in zip(present, read) if type(doc) is dict and doc["rank"] == keys[key]}
        if position_text.UNPARSED in read:
            self.store.left_out(read.count(position_text.UNPARSED))
        if len(found) + read.count(position_text.UNPARSED) < len(present):
            rank = min(
                keys[key]
                for key, doc in zip(present, read)
                if keys[key] not in found and doc is not position_text.UNPARSED
            )
            self._left_out("pos", rank, "not a rank position of this job: torn, or a field of the wrong type or bounds")
        return found

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
        rank runs under a relay, or while it is blocked and its leader's post is fresh: a hang's looks for an
        incident, ten a second on every blocked rank, then cost the store one a node); a value there that is not a
        counter (someone else wrote it) reads as no change."""
        if self.relay is not None:
            try:
                if self.relay.leader() == self.relay.rank:
                    if self.relay.read_every:  # a job of many nodes: its own post between reads (node.JOB_LOOKS_PER_S)
                        post = self.relay.posted()
                        if not self.relay.read_due(post):
                            return self._take_post(post)
                    return self._node_round()
                post = self.relay.posted()
                if self._relayed or self.relay.fresh(post):
                    return self._take_post(post)
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
        wanted = self.relay.wanted(staged, self.world_size)
        counters, beat_key = self._key("counters"), self._key("leader_beat")
        if counters not in self.store.seen:  # made once: read_together reads in one round trip only keys there
            self.store.add(counters, 0)
        # rank 0's beat, for the node's blocked ranks (only while some rank waits): in the same round trip
        beat_keys = [beat_key] if self._counters[0] > 0 else []
        raws = self.store.read_together([counters] + beat_keys + [self._key("fp", r) for r in wanted])
        value = self.store.counter_of(counters, raws.get(counters, ABSENT))
        if value is not None:
            self._counters = _split_counters(value)
        self._posted_beat = self.store.counter_of(beat_key, raws[beat_key]) if beat_key in raws else None
        self._relayed_fps = self._direct_fingerprints(wanted, raws)
        self.relay.post(value, self._relayed_fps, self._posted_beat)
        return self._counters

    def _take_post(self, post: dict) -> tuple:
        """The counters and partners' documents the node's leader left (an earlier round's while it has not posted)."""
        value, self._relayed_fps = self.relay.read_post(post, self.world_size)
        self._posted_beat = self.relay.leader_beat_of(post)
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
        is not a number). Under a relay, the one in the post that this round's counters() took, if it took one: a
        hang's blocked ranks ask it every round, and the node's leader read it for all of them."""
        value, self._posted_beat = self._posted_beat, None
        if value is None:
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
