"""Per-rank recording of collectives: a bounded ring of cheap records, the in-flight set, and call-site capture."""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
import types
from typing import TYPE_CHECKING, Any

from ..catalogue import P2P_COUNTS_KEPT
from ..config import DEFAULTS
from ..format import build
from .point_to_point import async_fields, p2p_fields
from .sites import (
    USER,
    kind_of_code,
    last_user_code,
    recorders,
    resolve_site,
    site_dict,
    user_frame_and_via,
    cached_via_site,
)
from .tensors import describe_tensors, tensor_meta  # noqa: F401 - tensor_meta: what the wrappers keep of tensors

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import RecordDoc

_monotonic, _get_ident = time.monotonic, threading.get_ident  # bound once: called twice per collective
_IN_FLIGHT, _COMPLETED = build.IN_FLIGHT, build.COMPLETED
# Where the records come from (the `recorder` option): a wrapper on every collective, or torch's Flight Recorder
# read by the watchdog thread when a rank stops making progress (watch/flight.py gives them through take_flight).
PYTHON, FLIGHT = "python", "flight"
# Library calls whose time windows the flight recorder keeps (call_window): well over the calls behind the records
# one read of the Flight Recorder hands the ring (watch/flight.py, HISTORY_KEPT), a few tuples each.
CALLS_KEPT = 256
# Wall clock = monotonic + offset: one clock read per record on the hot path, the other at formatting time.
_WALL_OFFSET = time.time() - time.monotonic()
# Thread ident -> name, refreshed whenever records are formatted (names are looked up then, not per op). An ident
# is reused once its thread ends: a refresh moves the ended threads' names aside, so that a new thread with the same
# ident is named afresh by begin() (it names a thread the first time its ident is not here).
_thread_names: dict = {}
_ended_names: dict = {}  # ident -> the name of a thread that ended: its records still name it
MAX_ENDED_NAMES = 4096


_threads_named = [0]  # how many threads were alive at the last refresh: the watchdog refreshes when that changes


def refresh_thread_names() -> None:
    threads = threading.enumerate()
    alive = {thread.ident: thread.name for thread in threads}
    if len(_ended_names) > MAX_ENDED_NAMES:
        _ended_names.clear()
    for ident in list(_thread_names):  # a copy: begin() may add a thread meanwhile, on its own thread
        if ident not in alive:
            _ended_names[ident] = _thread_names.pop(ident, None)
    _thread_names.update(alive)
    _threads_named[0] = len(threads)


def _thread_name(ident: int) -> str:
    if ident not in _thread_names:
        refresh_thread_names()
    return _thread_names.get(ident) or _ended_names.get(ident) or f"thread-{ident}"


class Record:
    """One collective as this rank issued it. Slots, raw values: formatting waits until someone reads it."""

    # `p2p`: (tag, batch ops) of a point-to-point record, set by its wrapper after begin(); never set on a
    # collective's record (read with getattr), so the collectives' hot path stores nothing more. `reduce`: the
    # reduce op of a collective that takes one, set by its wrapper (the fingerprint compares it; read with getattr);
    # `root` likewise, for a rooted one (broadcast, reduce, gather, scatter).
    __slots__ = (
        "seq",
        "group",
        "op",
        "api",
        "peer",
        "tensors",
        "site",
        "via",
        "region",
        "start_mono",
        "end_mono",
        "state",
        "error",
        "work",
        "thread",
        "p2p",
        "reduce",
        "root",
        "returned",
        "waiting",
    )
    # Annotations only (no class attributes: slots): what each slot holds, for the type checker and the reader.
    seq: int
    group: str
    op: str
    api: str
    peer: int | None
    tensors: Any
    site: tuple | None  # raw: (id(code), f_lasti), resolved by sites.resolve_site when read
    via: tuple | None  # (file, line, function, package) of the framework call it went through
    region: tuple | None  # (kind, raw site, api) of the DDP/FSDP region it ran in
    start_mono: float
    end_mono: float | None
    state: str
    error: str | None
    work: Any
    thread: int
    p2p: tuple
    reduce: Any
    root: tuple  # (rank, group rank) a rooted collective was given (read with getattr: set by its wrapper only)
    # A collective whose call returned with its op pending (async_op=True, a functional collective): the rank may be
    # anywhere meanwhile, not waiting in it. `waiting`: a thread is in wait_tensor() on it now (a functional one's;
    # a Work's wait is known from the Work.wait hook). Both read with getattr: set off the hot path only.
    returned: bool
    waiting: bool

    def __init__(
        self, seq: int, group: str, op: str, api: str, peer, tensors, thread: int, region, start_mono: float, state: str
    ) -> None:
        # The one builder of a record, whichever feed made it (the wrappers' Recorder.begin, the flight feed's
        # record_of): every slot the readers expect is set here, so neither can leave one unset. site and via are
        # the feed's to place after (from the caller's frame, or from the entry's frames).
        self.seq = seq
        self.group = group
        self.op = op
        self.api = api
        self.peer = peer
        self.tensors = tensors
        self.thread = thread
        self.region = region
        self.start_mono = start_mono
        self.state = state
        self.end_mono = self.error = self.work = self.site = self.via = None

    def to_dict(self, now_mono: float, waited: frozenset = frozenset()) -> RecordDoc:
        """Plain data; `waited`: ids of the Work objects some thread is blocked in wait() on now."""
        shapes, dtypes = describe_tensors(self.tensors)
        end = self.end_mono  # None while in flight, and for an UNTRACKED record (given up on before it ended)
        more = p2p_fields(self, waited) if self.peer is not None else _async_fields(self, waited)
        return build.record(
            self.seq,
            self.group,
            self.op,
            api=self.api,
            p2p=self.peer is not None,
            peer=self.peer,
            shapes=shapes,
            dtypes=dtypes,
            site=site_dict(self.site),
            via=self.via
            and {"file": self.via[0], "line": self.via[1], "function": self.via[2], "package": self.via[3]},
            region=self.region and {"kind": self.region[0], "site": self.region[1], "api": self.region[2]},
            start=round(self.start_mono + _WALL_OFFSET, 6),
            age_s=round(now_mono - self.start_mono, 4),
            duration_s=None if end is None else round(end - self.start_mono, 6),
            state=self.state,
            error=self.error,
            thread=_thread_name(self.thread),
            **more,
        )


def _async_fields(record: Record, waited: frozenset) -> dict:
    """A collective whose call returned with its op pending: `async`, and whether a thread waits on it now (in its
    Work's wait(), or wait_tensor() on a functional collective's output); {} for every other collective."""
    if not getattr(record, "returned", False):
        return {}
    return async_fields(record, waited, getattr(record, "waiting", False))


class Recorder:
    """The live recording of one process: sequence counters per group, a ring of records, the in-flight set."""

    def __init__(self, ring_size: int = DEFAULTS["ring_size"]):
        self._ring: collections.deque = collections.deque(maxlen=ring_size)
        self._inflight_limit = ring_size
        self._inflight: dict = {}  # record -> record, in the order they began
        # group, or (group, peer, op) for p2p -> the sequence number its next op gets: sends to a peer and receives
        # from it are counted apart, as they pair (send #k to B with B's recv #k from this rank)
        self._next_seq: dict = {}
        self._groups: dict = {}  # group name -> its ranks (None: the default group)
        self._host_sync: dict = {}  # group name -> whether its ops are done when their call returns (gloo)
        self._by_work: dict = {}  # id(Work) -> the record it completes (the record holds the Work: no id reuse)
        self._progress = 0
        self._progress_mono = time.monotonic()
        self._site_counts: dict = {}  # raw site -> how many collectives that line issued
        self._ddp_steps = 0  # grad-enabled DDP forwards: ranks that ran different numbers of steps differ here
        # Per-thread state, keyed by thread ident in plain containers: a threading.local attribute costs ~4x a dict
        # lookup, and the hot path needs the ident anyway (for the record).
        self._busy: set = set()  # threads inside a patched call: a patched call nested in it records nothing
        self._regions: dict = {}  # thread -> its region stack ("inside DDP.forward called from val.py:42")
        self._issuing: dict = {}  # thread -> the record of the synchronous device-backend call it is issuing
        self._in_wait: dict = {}  # thread -> the Work it is blocked in wait() on now (set by the Work.wait hook)
        # The process group of a grad-enabled DDP forward whose gradient all-reduce the next backward() will run.
        self._pending_grad_sync = None
        self._failure_hook = None  # set by the watchdog while it runs
        self._formatted: dict = {}  # finished record -> (its state, its to_dict()): see _recent_docs
        self._counts_by_line: dict = {}  # "file:line" -> count, folded from site_counts when the code caches empty
        self._kind = PYTHON
        self._flight_inflight: set = set()  # the records in flight that the flight recorder gave
        # The flight recorder's windows of the library calls that issue several ops (call_window): (thread, start
        # ns, end ns) of the last CALLS_KEPT, and thread -> start ns of the one it is inside now.
        self._calls: collections.deque = collections.deque(maxlen=CALLS_KEPT)
        self._open_calls: dict = {}
        recorders.add(self)
        refresh_thread_names()  # a thread that ended before this recording began may have left its ident to another

    # --- what others read (read-only: every change goes through a method below that says what happened) ---
    ring = property(lambda self: self._ring, doc="The last records, oldest first (at most ring_size).")
    inflight = property(lambda self: types.MappingProxyType(self._inflight), doc="The records in flight, in order.")
    progress = property(lambda self: self._progress, doc="How many times a record began or ended.")
    progress_mono = property(lambda self: self._progress_mono, doc="monotonic() when a record last began or ended.")
    busy = property(lambda self: frozenset(self._busy), doc="The threads now inside a patched call.")
    ddp_steps = property(lambda self: self._ddp_steps, doc="How many grad-enabled DDP forwards ran (training steps).")
    failure_hook = property(lambda self: self._failure_hook, doc="Called with the error of a failed collective.")
    groups = property(lambda self: types.MappingProxyType(self._groups), doc="Group name -> its ranks (None: all).")
    kind = property(lambda self: self._kind, doc="Where the records come from: PYTHON or FLIGHT.")

    def runs_on_host(self, group: str) -> bool:
        """Whether the group's ops are done when their call returns (gloo), as note_group was told."""
        return self._host_sync.get(group, False)

    @property
    def last_seq(self) -> dict:
        """Group -> the sequence number of its last collective (p2p pairs have their own counters)."""
        return {key: n - 1 for key, n in list(self._next_seq.items()) if n and not isinstance(key, tuple)}

    def p2p_counts(self) -> dict:
        """ "group:op:peer" -> how many sends to / receives from that peer began (at most P2P_COUNTS_KEPT pairs)."""
        counts = [(key, n) for key, n in list(self._next_seq.items()) if isinstance(key, tuple)]
        return {f"{group}:{op}:{peer}": n for (group, peer, op), n in counts[:P2P_COUNTS_KEPT]}

    # --- what others tell it ---
    def note_group(self, name: str, ranks, runs_on_host: bool) -> None:
        """A process group was seen for the first time: its ranks (None: the default group) and its kind."""
        self._groups[name] = ranks
        self._host_sync[name] = runs_on_host

    def note_ddp_forward(self, process_group) -> None:
        """A grad-enabled DDP forward ran: one step more, and the next backward() all-reduces on this group."""
        self._ddp_steps += 1
        self._pending_grad_sync = process_group

    def take_pending_grad_sync(self):
        """The group whose gradient all-reduce this backward() runs (None if no synced DDP forward came before)."""
        pg, self._pending_grad_sync = self._pending_grad_sync, None
        return pg

    def set_failure_hook(self, hook) -> None:
        """Call `hook(error)` when a recorded collective fails (None: call nothing)."""
        self._failure_hook = hook

    def hot_path_parts(self) -> tuple:
        """(busy threads, mark busy, unmark, issuing, records by Work), lent once to the per-op wrappers. They read
        the containers but set and pop their thread's issuing entry, by subscript (a bound __setitem__: +90 ns/op)."""
        return self._busy, self._busy.add, self._busy.discard, self._issuing, self._by_work

    def wait_marks(self) -> dict:
        """thread -> the Work it waits on now: the Work.wait hook sets and clears its thread's entry."""
        return self._in_wait

    # --- regions: "this happened inside DDP.forward called from val.py:42" ---
    @contextlib.contextmanager
    def region(self, entry: tuple):
        """Records begun inside carry `entry` as their region; the stack is this thread's and is dropped when empty."""
        ident = _get_ident()
        stack = self._regions.get(ident)
        if stack is None:
            stack = self._regions[ident] = []
        stack.append(entry)
        try:
            yield
        finally:
            stack.pop()
            if not stack:
                self._regions.pop(ident, None)

    def current_region(self, ident: int | None = None):
        """The innermost region of a thread (this one by default), or None."""
        stack = self._regions.get(_get_ident() if ident is None else ident)
        return stack[-1] if stack else None

    # --- library calls that issue several ops: one record under the python recorder, one window under flight ---
    @contextlib.contextmanager
    def call_window(self):
        """The flight recorder's mark of one call that issues several ops (DDP's buffer broadcast, its bucket rebuild,
        the gradient all-reduce of a backward), which the python recorder records once: its thread and its start and
        end on the system clock, the Flight Recorder's, by which the feed folds the call's entries into one record
        (watch/flight_calls.py). A call inside another belongs to the outer one, as a nested patched call does."""
        ident = _get_ident()
        if ident in self._open_calls:
            yield
            return
        self._open_calls[ident] = start = time.time_ns()
        try:
            yield
        finally:
            # Kept finished before it stops being open: a read in between sees it twice, never not at all.
            self._calls.append((ident, start, time.time_ns()))
            self._open_calls.pop(ident, None)

    def call_windows(self) -> list:
        """(thread, start ns, end ns, or None while the call runs) of the recent calls call_window marked."""
        finished = list(self._calls)  # list() of a deque or of a dict's items runs in C: no thread interleaves
        return finished + [(ident, start, None) for ident, start in list(self._open_calls.items())]

    # --- the flight recorder's feed (watch/flight.py), on the watchdog thread ---
    def note_recorded_by(self, kind: str) -> None:
        """Say where the records come from (the session, once it knows whether the flight recorder can serve)."""
        self._kind = kind

    def take_flight_lines(self, counts: dict) -> None:
        """The flight recorder gave finished records their lines (set on them): `counts` is how many collectives
        each line issued, (file, line, function) -> count, over what the Flight Recorder holds."""
        self._site_counts = dict(counts)
        self._formatted = {}  # the records' lines changed, not their states: format them again

    def take_flight(self, inflight: list | None, history: list, last_seq: dict, ops: int) -> None:
        """What the flight recorder read: `ops` collectives issued since its last read (progress), the Records in
        flight now (a Record it gave before and gives no more has finished; None: a read that did not look, the
        ones in flight stay as they are), the Records new to the ring (finished ones, and those in flight the first
        time they are given), and each group's last sequence number. In this mode no per-op wrapper writes these
        containers: the watchdog thread alone does, here."""
        now = _monotonic()
        if ops:
            self._progress += ops
            self._progress_mono = now
        if inflight is None:
            self._ring.extend(history)
            self._note_last_seq(last_seq)
            return
        current = set(inflight)
        for record in [record for record in self._flight_inflight if record not in current]:
            record.end_mono = max(now, record.start_mono)
            record.state = _COMPLETED
            self._inflight.pop(record, None)
        self._ring.extend(history)
        for record in inflight:
            record.end_mono, record.state = None, _IN_FLIGHT  # one found in flight again by a later look
            self._inflight[record] = record
        self._flight_inflight = current  # the point-to-point ops in flight are the wrappers' records, not these
        self._note_last_seq(last_seq)

    def _note_last_seq(self, last_seq: dict) -> None:
        for group, seq in last_seq.items():
            self._next_seq[group] = max(self._next_seq.get(group, 0), seq + 1)

    def begin(self, op: str, api: str, group: str, tensors, caller, peer=None, ident=None) -> Record:
        """Open a record: the hot path, so raw values only (tuples, ints); formatting waits for to_dict().

        `caller` is the frame that called the collective; `ident` the calling thread's, when the caller has it.
        """
        key = group if peer is None else (group, peer, op)
        next_seq = self._next_seq
        seq = next_seq.get(key, 0)
        next_seq[key] = seq + 1
        if ident is None:
            ident = _get_ident()
        if ident not in _thread_names:
            _thread_names[ident] = threading.current_thread().name  # once per thread: it may be gone when read
        regions = self._regions.get(ident)
        self._progress_mono = start = _monotonic()
        record = Record(seq, group, op, api, peer, tensors, ident, regions[-1] if regions else None, start, _IN_FLIGHT)
        # Found now: the stack is gone by the time anyone reads the record. Usually the caller is the user's line.
        code = caller.f_code
        if code is last_user_code[0]:  # a loop calls its collectives from the same function, op after op
            frame = caller
        else:
            entry = kind_of_code.get(id(code))
            if entry is not None and entry[0] is code and entry[1] == USER:
                frame = caller
                last_user_code[0] = code
            else:
                frame, via = user_frame_and_via(caller)
                record.via = via and cached_via_site(via)
        if frame is not None:
            record.site = site = (id(frame.f_code), frame.f_lasti)
            # How often each line issued a collective: "has this rank ever been here?" without keeping history.
            site_counts = self._site_counts
            site_counts[site] = site_counts.get(site, 0) + 1
        self._ring.append(record)
        inflight = self._inflight
        inflight[record] = record  # keyed by the record itself: hashed by identity, no id() int to make
        if len(inflight) > self._inflight_limit:
            self._untrack_oldest()
        self._progress += 1
        return record

    def finish_returned(self, record: Record) -> None:
        """finish() for the common case, a call that is done when it returned without error: the hot path."""
        record.end_mono = self._progress_mono = _monotonic()
        record.state = _COMPLETED
        if record.work is not None:
            self._forget_work(record)
        self._inflight.pop(record, None)
        self._progress += 1

    def _untrack_oldest(self) -> None:
        """Bound the in-flight set: a backend whose Work never says "completed" must not grow it forever."""
        oldest = self._inflight.pop(next(iter(self._inflight)))
        oldest.state = build.UNTRACKED
        self._forget_work(oldest)

    def _forget_work(self, record: Record) -> None:
        work = record.work
        if work is not None:
            for part in (work,) + tuple(getattr(work, "works", ())):
                if self._by_work.get(id(part)) is record:
                    del self._by_work[id(part)]
            record.work = None

    def issued(self, record: Record, handle=None) -> None:
        """The collective's call returned: decide whether the op is done now or when its Work says so.

        `handle` is the Work an async call returned to the user. A synchronous call on a host backend (gloo) is done
        when it returns; on a device backend (NCCL) it is done when the Work that c10d waited on inside the call
        (captured by `waited`) completes, which the watchdog polls.
        """
        if handle is None or not hasattr(handle, "is_completed"):
            work = record.work
            if work is None or self._host_sync.get(record.group, False) or _completed(work):
                self.finish(record)
            return
        record.work = handle
        record.returned = True  # the user holds the Work: until its wait(), the rank is not waiting in this op
        self._by_work[id(handle)] = record
        for part in getattr(handle, "works", ()):  # batch_isend_irecv: the user waits on each Work of the batch
            self._by_work[id(part)] = record

    def waited(self, work, issuing: Record | None, error: BaseException | None = None) -> None:
        """Work.wait() returned (or raised). Inside a synchronous call it only names that call's Work."""
        if issuing is not None and issuing.work is None:
            if error is None and not self._host_sync.get(issuing.group, False):
                issuing.work = work
            return
        record = self._by_work.get(id(work))
        if record is None:
            if error is not None and self._kind == FLIGHT:
                self._call_failure_hook(error)  # no records of its own: a failed wait still says a peer is gone
            return
        if record.work is not work:  # one Work of a batch: the record is done when all of them are
            if work in getattr(record.work, "works", ()):
                if error is not None:
                    self.finish(record, error)
                elif _completed(record.work):
                    self.finish(record)
            return
        if error is not None:
            self.finish(record, error)
        elif self._host_sync.get(record.group, False) or _completed(work):
            self.finish(record)  # on a host backend a returned wait() is completion, whatever is_completed says

    def finish(self, record: Record, error: BaseException | None = None) -> None:
        if error is None:
            self.finish_returned(record)
            return
        record.end_mono = self._progress_mono = _monotonic()
        record.state = build.FAILED
        record.error = f"{type(error).__name__}: {error}"[:500]
        if record.work is not None:
            self._forget_work(record)
        self._inflight.pop(record, None)
        self._progress += 1
        self._call_failure_hook(error)

    def _call_failure_hook(self, error: BaseException) -> None:
        hook = self._failure_hook
        if hook is not None:
            try:
                hook(error)  # the watchdog reports a vanished peer before the user's error goes on
            except Exception:
                pass

    def void(self, record: Record) -> None:
        """Forget a record that turned out not to communicate (Reducer._rebuild_buckets returning False)."""
        self._inflight.pop(record, None)
        if self._ring and self._ring[-1] is record:
            self._ring.pop()  # the usual case, O(1): nothing was recorded since
        else:
            try:
                self._ring.remove(record)
            except ValueError:
                pass
        key = record.group if record.peer is None else (record.group, record.peer, record.op)
        # Give the sequence number back so positions stay aligned with peers that never called it.
        self._next_seq[key] = record.seq

    def poll_pending(self) -> None:
        """Complete records whose Work handle says done (NCCL: the call returned long before the op finished)."""
        for record in list(self._inflight.values()):
            work = record.work
            if work is None:
                continue
            try:
                done = work.is_completed()
            except Exception as exc:  # a failed op raises here on some backends
                self.finish(record, exc)
                continue
            if done:
                self.finish(record)

    def named_codes(self) -> set:
        """The code ids this recorder's raw sites name, once its site counts are folded (see CODE_LIMIT)."""
        self._counts_by_line = self._site_counts_by_line()
        self._site_counts.clear()
        records = list(self._ring) + list(self._inflight)
        return {record.site[0] for record in records if record.site is not None}

    def _site_counts_by_line(self) -> dict:
        counts: dict = dict(self._counts_by_line)
        for raw, count in list(self._site_counts.items()):
            site = resolve_site(raw)
            if site is not None:
                key = f"{site[0]}:{site[1]}"
                counts[key] = counts.get(key, 0) + count
        return counts

    def snapshot(self, recent: int = 16, site_counts: bool = True) -> dict:
        """This rank's recording as plain data: `recent` finished records, and the site counts when asked for
        (a position-only heartbeat leaves both out: formatting new records is most of a round's cost)."""
        if threading.active_count() != _threads_named[0]:
            # A thread came or went (else begin() named every thread that recorded). Missed: one that ended while
            # another started, between two rounds, and took its ident; that one reads under the ended one's name.
            refresh_thread_names()
        now = time.monotonic()
        inflight = sorted(self._inflight.values(), key=lambda r: r.start_mono)
        waited = frozenset(id(work) for work in list(self._in_wait.values()))
        done = self._recent_done(recent, len(inflight)) if recent else []
        return {
            "progress": self._progress,
            "idle_s": round(now - self._progress_mono, 4),
            "inflight": [r.to_dict(now, waited) for r in inflight],
            "recent": self._recent_docs(done, now),
            "last_seq": {str(k): v for k, v in self.last_seq.items()},
            "p2p_counts": self.p2p_counts(),
            "groups": dict(self._groups),
            "ops_recorded": self._progress,
            "ddp_steps": self._ddp_steps,
            "site_counts": self._site_counts_by_line() if site_counts else {},
            "recorder": self._kind,
        }

    def _recent_docs(self, done: list, now: float) -> list:
        """to_dict() of finished records, each formatted once: in a slow step (a second or more) the watchdog's
        rounds publish the same recent records again and again, and only their age moves."""
        cache, fresh, docs = self._formatted, {}, []
        for record in done:
            entry = cache.get(record)
            if entry is None or entry[0] != record.state:
                entry = (record.state, record.to_dict(now))
            else:
                entry[1]["age_s"] = round(now - record.start_mono, 4)
            fresh[record] = entry
            docs.append(dict(entry[1]))  # a copy: whoever reads the snapshot may add to it
        self._formatted = fresh  # only the records shown last time: the cache never outgrows one snapshot
        return docs

    def _recent_done(self, recent: int, inflight: int) -> list:
        """The last `recent` records that are not in flight, among the ring's last recent + inflight ones.

        Read from the ring's newest end: the watchdog takes this every round, and copying the whole ring (2,048
        records) for 8 of them was most of its time. list(islice(reversed(deque))) runs in C without a bytecode
        boundary, so a training thread appending meanwhile cannot interleave (no "deque mutated during iteration").
        """
        newest = list(itertools.islice(reversed(self._ring), recent + inflight))
        done = [r for r in newest if r.state != _IN_FLIGHT][:recent]
        done.reverse()
        return done


def _completed(work) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False
