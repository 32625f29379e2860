"""The flight recorder: a rank's collectives as torch's own Flight Recorder keeps them, read on the watchdog thread.

No wrapper runs on any collective. Every POLL_S the feed reads each process group's sequence number (about 13 us a
group): a change is progress. Once the rank has made none for LOOK_AFTER_S while one of its threads waits inside
torch, or a collective is pending (enqueued, not completed: the dump's header), it reads the Flight Recorder once
(one dump: about 25 ms at 2,000 entries, holding the GIL while the training thread waits anyway) and hands the
Recorder the collectives still in flight, placed at the waiting thread's own line (else the line that issued
them), and those finished since its last read.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time

from .. import catalogue, flight_entries
from ..capture import record as record_module
from ..capture.sites import cached_via_site, code_site, is_internal_file, user_frame_and_via
from ..flight_entries import (
    canonical_op,
    classify,
    first_user_frame,
    group_of,
    is_collective,
    shapes_and_dtypes,
    thread_of,
)
from ..format import build
from ..logonce import log_once
from .flight_calls import fold
from .flight_support import buffer_size, read_dump, read_status

POLL_S = 0.1  # between two reads of the groups' sequence numbers (less near a block in a very fast job: _poll_gap)
MIN_POLL_S = 0.01  # the shortest gap between two polls (the watchdog sleeps no less: watchdog.MIN_PAUSE_S)
LOOK_AFTER_S = 0.2  # no progress this long, a thread waiting inside torch or a collective pending: read it
HISTORY_KEPT = 64  # finished collectives handed to the ring per group and read (the ring keeps ring_size)
READ_SHARE = 0.005  # of the wall time, at most, that refresh()'s reads take: a read's cost sets the next one's time
# A fast job issues more collectives between two reads than the Flight Recorder keeps (2,000 by default): a read then
# hands over a sample, and the ranks' samples must be the same positions for watch/fingerprints.py to compare them.
# So it is the block of HISTORY_KEPT positions that ends at a multiple of the stride, read as soon as a group's
# count passes that multiple: every rank reads the same blocks. The stride is a power of two sized by the reads'
# cost (READ_SHARE), so two ranks' strides divide each other: the larger one's blocks are read by both.
MIN_STRIDE = 128
WAITING, PENDING = "waiting", "pending"  # why a look was made: FlightFeed._looked
# Where a thread that waits on a collective stands, by module: torch.distributed (c10d's wait), autograd (DDP's
# gradient all-reduce in backward), DDP's forward, torch.ops (a functional collective's wait_tensor called as an
# op, as compiled code calls it), or ddpwatch's own Work.wait hook. A thread computing in one of these only costs
# a read that finds nothing in flight.
WAITING_IN = (
    "torch.distributed.",
    "torch.autograd.",
    "torch.nn.parallel.",
    "torch._ops",
    "torch._library.",
    "ddpwatch.capture.",
)
WAITING_DEPTH = 16
_logged: set = set()


def read_flight_recorder(stack_traces: bool = False) -> list | None:
    """The Flight Recorder's entries (collectives), oldest first; None when it cannot be read. With `stack_traces`
    each entry has its Python frames (about 25-45 ms at 2,000 entries, as without, once load_symbolizer() ran).
    A dump with stack traces fails whole when one frame's file name is not valid UTF-8 (torch cannot cast it): the
    entries then come without their frames, rather than not at all."""
    data = read_dump(stack_traces=stack_traces, nccl=False)  # the feed serves gloo (flight_support.SERVED_BACKENDS)
    if data is None:
        return read_flight_recorder(False) if stack_traces else None
    return [entry for entry in data["entries"] if isinstance(entry, dict)]


@contextlib.contextmanager
def collection_paused():
    """Python's cyclic collector off while a read makes and drops its objects (tens of thousands: an entry's dict,
    its frames' dicts, their strings). Left on, they survive the young collections the read itself triggers, reach
    the oldest generation and bring on full collections: one took 116 ms of a 145 ms read, measured in a job with
    torch._inductor loaded, with the GIL held, the training thread stopped. Off, they are freed uncollected and
    count for nothing; the training thread's own allocations meanwhile are collected once it is back on. Left off
    if the program turned it off."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def waiting_threads(skip: int) -> dict:
    """ident -> top frame of each thread (but `skip`) that waits inside torch: its innermost frame is not the user's
    code and one of its innermost WAITING_DEPTH frames is torch's distributed, autograd or DDP code (DTensor's
    wait_tensor sits under torch._ops)."""
    return {
        ident: frame
        for ident, frame in sys._current_frames().items()
        if ident != skip and is_internal_file(frame.f_code.co_filename) and _inside_torch_distributed(frame)
    }


def _inside_torch_distributed(frame) -> bool:
    for _ in range(WAITING_DEPTH):
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith(WAITING_IN):
            return True
        frame = frame.f_back
    return False


def dumped_frames(entry: dict) -> list:
    """An entry's frames (a dump with stack traces) as flight_entries reads them, innermost first."""
    return [
        {
            "file": str(raw.get("filename") or "?"),
            "line": raw.get("line"),
            "function": str(raw.get("name") or "?"),
            "internal": is_internal_file(str(raw.get("filename") or "?")),
        }
        for raw in entry.get("frames") or ()
        if isinstance(raw, dict)
    ]


def frames_of(frame) -> list:
    """A live stack as the Flight Recorder writes one: innermost first, each frame a dict (flight_entries)."""
    stack: list = []
    while frame is not None and len(stack) < 256:
        code = frame.f_code
        stack.append(
            {
                "file": code.co_filename,
                "line": frame.f_lineno,
                "function": code.co_name,
                "internal": is_internal_file(code.co_filename),
            }
        )
        frame = frame.f_back
    return stack


def collectives_pending(status) -> bool:
    """Whether a group's status (the Flight Recorder's pg_status: group -> its last enqueued and last completed
    collective) shows one enqueued and not yet completed. Gloo marks an op completed when it finishes, waited on
    or not (an async op polled to completion counts), a moment after a synchronous call returns."""
    if not isinstance(status, dict):
        return False
    for group in status.values():
        try:
            if int(group["last_enqueued_collective"]) > int(group["last_completed_collective"]):
                return True
        except (KeyError, TypeError, ValueError):
            continue
    return False


def record_id(entry: dict) -> int:
    """The entry's place in the Flight Recorder's order of creation (every process group's ops together)."""
    return entry.get("record_id") or 0


def last_seq_by_group(entries: list) -> dict:
    """Group -> the sequence number of its last collective, counted from 0 as the python recorder counts."""
    last: dict = {}
    for entry in entries:
        if is_collective(entry):
            last[group_of(entry)] = max(last.get(group_of(entry), -1), entry["collective_seq_id"] - 1)
    return last


class FlightFeed:
    """Gives a Recorder what the Flight Recorder holds; run by the watchdog thread (poll() each wake-up, refresh()
    each round; both cheap when there is nothing to read).

    `name_of(pg)`: the group's name as every rank gives it (Patcher.group_name, which also tells the Recorder the
    group's ranks the first time it meets one). `reduce_notes`: the reduce ops other than SUM, by thread and time."""

    def __init__(self, recorder, name_of, reduce_notes=None):
        self.recorder = recorder
        self._name_of = name_of
        self._reduce_notes = reduce_notes  # capture/reduce_ops.ReduceNotes: the calls made with an op but SUM
        # id(process group) -> (its name, its sequence number at the last poll: collectives and point-to-point)
        self._seqs: dict = {}
        self._quiet_since = time.monotonic()
        self._next_poll = 0.0
        # Why the Flight Recorder was read since the last progress: WAITING (a thread waited inside torch), PENDING
        # (no thread did, a collective was pending), or None (not read)
        self._looked: str | None = None
        self._known: dict = {}  # (group, seq) -> the Record given for it (a look that finds it again keeps it)
        self._newest_id = -1  # the newest entry (record_id) already handed to the ring
        self._wall_offset = time.time() - time.monotonic()
        self._unread = 0  # collectives issued since the last read
        self._next_read = 0.0  # refresh() reads no sooner: each read's own cost sets the next (READ_SHARE)
        self._line_counts: dict = {}  # (file, line, function) -> collectives that user line issued, every read's
        self._stride = MIN_STRIDE  # sampled reads take the block ending at a multiple of it (see MIN_STRIDE)
        self._p2p: dict = {}  # group name -> its point-to-point ops at the last read (counted, but not collectives)
        self._blocks: dict = {}  # group name -> the multiple of the stride its count had reached at the last read
        self._block_due = False  # a group's count passed a multiple of the stride: the next refresh reads at once
        self._progressed = False  # the last poll found progress (a quiet rank reads the same newest positions)
        self._last_read = (time.monotonic(), 0)  # (when, collectives counted by then): the rate that sizes the stride
        self._counted_total = 0  # collectives and point-to-point ops counted by every poll
        self._gains: dict = {}  # group name -> its collectives and point-to-point ops counted by the last poll
        self._last_poll = time.monotonic()
        self._buffer = buffer_size()

    def due_in(self, now: float) -> float:
        """Seconds until the next poll is due (the watchdog sleeps no longer)."""
        return max(0.0, self._next_poll - now)

    def poll(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now < self._next_poll:
            return
        ops = self._count_new_ops()
        self._next_poll = now + self._poll_gap(now, ops)
        self._progressed = bool(ops)
        if ops:
            self._quiet_since, self._looked = now, None
            self._unread += ops
            # What a look found in flight is over, or no longer what the rank waits on: never leave it standing
            # while the rank computes (a record in flight after progress would read as a rank blocked in it).
            self.recorder.take_flight([], [], {}, ops)
            if self._block_due:  # now, not at the next round: by then a fast job may have pushed it out of the buffer
                self.refresh(now)
            return
        if self._looked:
            self._end_look_if_nothing_waits(now)
            return
        if now - self._quiet_since < LOOK_AFTER_S:
            return
        waiting = waiting_threads(skip=threading.get_ident())
        # No thread waits inside torch, yet a collective can be: an async op whose thread polls is_completed() or
        # computes, or, NCCL's way, blocks outside torch at a device sync. The header says so (enqueued, not done).
        if waiting or self._collective_pending():
            self._looked = WAITING if waiting else PENDING
            self.look(waiting)

    def _poll_gap(self, now: float, issued: int) -> float:
        """POLL_S, unless the job runs so fast that a block could leave the Flight Recorder's buffer within 2 *
        POLL_S of its multiple being passed (above about 9,700 collectives a second with 2,000 entries: an NCCL
        job's speed). Then the next poll is due within half that time after the nearest group's next multiple, at
        its current rate: it reads the block while the buffer still holds it. Polls come closer only near a multiple,
        once a stride. `issued`: every group's ops since the last poll (the buffer is one ring for all of them)."""
        elapsed, self._last_poll = now - self._last_poll, now
        if elapsed <= 0 or not issued:
            return POLL_S
        stays = max(0, self._buffer - HISTORY_KEPT) * elapsed / issued  # seconds a passed block stays readable
        if stays >= 2 * POLL_S:
            return POLL_S
        gap = POLL_S
        for name, count in self._seqs.values():
            gained = self._gains.get(name)
            if name and gained:
                collectives = count - self._p2p.get(name, 0)
                ahead = self._stride - collectives % self._stride  # to the group's next multiple
                gap = min(gap, ahead * elapsed / gained + stays / 2)
        return max(MIN_POLL_S, gap)

    def _end_look_if_nothing_waits(self, now: float) -> None:
        """A collective's completion moves no sequence number: a rank that waited in a barrier (a look found it in
        flight), got through and now computes has issued nothing. Once no thread waits inside torch, what a look
        made for a waiting thread found is over (else that rank reads as blocked in it: a false deadlock once a peer
        blocks), even where another collective is still pending: the next look, made for that one, finds it again
        without the barrier. What a look made for a pending collective found is over once nothing is pending. A
        later wait is looked at afresh."""
        if waiting_threads(skip=threading.get_ident()):
            return
        if self._looked == PENDING and self._collective_pending():
            return
        self._quiet_since, self._looked = now, None
        self.recorder.take_flight([], [], {}, 0)

    def _collective_pending(self) -> bool:
        return collectives_pending(self._read_status())

    @staticmethod
    def _read_status():
        return read_status()

    def refresh(self, now: float | None = None, now_or_never: bool = False) -> None:
        """Once a round, while the rank makes progress: the collectives finished since the last read, with their
        lines (watch/fingerprints.py compares them across ranks: the mismatches that never hang). A read costs about
        25 ms at 2,000 entries, a few at tens: the next waits until this one's cost is READ_SHARE of the time, and
        for a fast job until a group's count passes a multiple of the stride (MIN_STRIDE), so that every rank hands
        over the same sample; a rank at rest reads its newest, which its peers at rest share.
        `now_or_never`: an incident's answer carries this rank's positions, whatever the last read cost."""
        now = time.monotonic() if now is None else now
        if not (now_or_never or self._read_due(now)):
            return
        started, last = time.perf_counter(), {}
        with collection_paused():
            entries = read_flight_recorder(stack_traces=True)
            self._unread, self._block_due = 0, False
            if entries:
                self._take(entries, None)
                last = last_seq_by_group(entries)  # every op's, before _take folds a library call's into one
            del entries  # freed before collections resume: see collection_paused
        cost = time.perf_counter() - started  # the dump and what was made of it
        self._next_read = now + cost / READ_SHARE
        self._size_stride(now, cost)
        self._note_blocks(last)

    def _read_due(self, now: float) -> bool:
        if not self._unread:
            return False
        if self._block_due:
            return True
        return now >= self._next_read and (self._unread <= HISTORY_KEPT or not self._progressed)

    def _size_stride(self, now: float, cost: float) -> None:
        """The stride at which reads keep to READ_SHARE at this rank's current rate (a power of two, see MIN_STRIDE)."""
        when, counted = self._last_read
        self._last_read = (now, self._counted_total)
        if now <= when:
            return
        wanted = (self._counted_total - counted) / (now - when) * cost / READ_SHARE
        self._stride = max(MIN_STRIDE, 1 << max(0, int(wanted) - 1).bit_length())

    def _note_blocks(self, last_seqs: dict) -> None:
        """After a read: each group's multiple of the stride reached so far, and its point-to-point ops (counted by
        the poll with the collectives, but not by the Flight Recorder's collective sequence numbers)."""
        counted = {name: seq for name, seq in self._seqs.values() if name}
        for name, last in last_seqs.items():
            collectives = last + 1
            self._blocks[name] = collectives // self._stride
            self._p2p[name] = max(0, counted.get(name, collectives) - collectives)

    def _passed_a_block(self) -> bool:
        """A group's collectives (its count less its point-to-point ops) passed a multiple of the stride."""
        stride = self._stride
        return any(
            (count - self._p2p.get(name, 0)) // stride > self._blocks.get(name, 0)
            for name, count in self._seqs.values()
            if name
        )

    def _count_new_ops(self) -> int:
        """Collectives (and point-to-point ops) issued on any group since the last poll."""
        seqs, gains, ops = {}, {}, 0
        for pg, seq in self._read_counts():
            known = self._seqs.get(id(pg))
            if known is None:  # a group met for the first time: the Recorder learns its ranks
                known = (self._name_of(pg), 0)
            gained = abs(seq - known[1])
            ops += gained
            seqs[id(pg)] = (known[0], seq)
            if known[0]:
                gains[known[0]] = gained
        self._seqs, self._gains = seqs, gains  # the groups alive now: a destroyed one is no longer followed
        self._counted_total += ops
        if ops and not self._block_due:
            self._block_due = self._passed_a_block()
        return ops

    @staticmethod
    def _read_counts() -> list:
        """(process group, its sequence number) for each group alive; those that cannot be read are left out."""
        try:
            from torch.distributed import distributed_c10d as c10d

            groups = list(c10d._world.pg_map)
        except Exception:
            return []
        counts = []
        for pg in groups:
            try:
                counts.append((pg, int(pg._get_sequence_number_for_group())))  # type: ignore[attr-defined]
            except Exception:
                continue
        return counts

    def look(self, waiting: dict) -> None:
        """Read the Flight Recorder while a thread waits: the collectives in flight (at the waiting thread's line),
        and those finished since the last read."""
        self._unread = 0
        with collection_paused():
            entries = read_flight_recorder(stack_traces=True)
            if entries:
                self._take(entries, waiting)
            del entries

    def _take(self, entries: list, waiting: dict | None) -> None:
        """Hand the Recorder what one read holds. `waiting`: the threads waiting inside torch (a look), or None (a
        refresh while the rank makes progress: what is in flight then is a moment's state, left to the next read).
        A folded entry (one library call's ops) carries its first op's record_id: the ids stay in order."""
        entries = self._calls_of(entries)
        in_flight = flight_entries.in_flight(entries)
        inflight, fresh = [], []
        if waiting is not None:
            for entry in in_flight:
                key = (group_of(entry), entry["collective_seq_id"] - 1)
                record = self._known.get(key)
                if record is None:
                    # Placed at the line its thread waits at now: the op it waits on, or one of the async ops it
                    # issued since its last finished one (DDP's buffer broadcast is several).
                    record = self._known[key] = self.record_of(entry, waiting.get(thread_of(entry)))
                    fresh.append(record)
                # Its thread does not wait inside torch now: the call returned with its op pending (async_op=True,
                # a thread that polls or computes), so the rank does not wait in it (analysis.reading.waits_in: no
                # crossing counts it). Asked again at each look: a thread that waits on it later waits in it.
                record.returned = record.thread not in waiting
                inflight.append(record)
            self._known = {(record.group, record.seq): record for record in inflight}
        fresh_entries = self._fresh_entries(entries, in_flight, waiting is None)
        self._count_lines(fresh_entries)
        sampled = waiting is None and self._progressed  # a look, or a rank at rest: its newest positions
        finished = [self.record_of(entry, None, done=True) for entry in self._kept(fresh_entries, sampled)]
        self.recorder.take_flight(
            inflight if waiting is not None else None, finished + fresh, last_seq_by_group(entries), 0
        )
        self.recorder.take_flight_lines(dict(self._line_counts))

    def _calls_of(self, entries: list) -> list:
        """The entries, one per library call where the python recorder records one (flight_calls.fold); as they
        came if that fails: a record per op is a worse history, not a reason to lose it."""
        try:
            return fold(entries, self.recorder.call_windows())
        except Exception:
            log_once(_logged, "fold", "ddpwatch: could not fold the Flight Recorder's entries by call", exc_info=True)
            return entries

    def _fresh_entries(self, entries: list, in_flight: list, stop_at_in_flight: bool) -> list:
        """The collectives finished since the last read. A refresh stops at the first one in flight: handed over
        later, when it has finished or a look finds it waiting. Only the newest HISTORY_KEPT of them become
        Records (a read every few seconds may find thousands: the ring and the fingerprints take a sample)."""
        in_flight_ids = {id(entry) for entry in in_flight}
        limit = min((record_id(entry) for entry in in_flight), default=None) if stop_at_in_flight else None
        fresh = [
            entry
            for entry in entries
            if self._newest_id < record_id(entry) and (limit is None or record_id(entry) < limit)
        ]
        if fresh:
            self._newest_id = max(record_id(entry) for entry in fresh)
        return [entry for entry in fresh if id(entry) not in in_flight_ids and is_collective(entry)]

    def _kept(self, fresh: list, sampled: bool) -> list:
        """The finished collectives that become Records, per group: all of them where they are few, else the block
        of HISTORY_KEPT that ends at the group's newest multiple of the stride (`sampled`: a read while the rank
        runs, which its peers make at the same multiples) or its newest HISTORY_KEPT (a look, or a rank at rest)."""
        by_group: dict = {}
        for entry in fresh:
            by_group.setdefault(group_of(entry), []).append(entry)
        kept = []
        for entries in by_group.values():
            if len(entries) <= HISTORY_KEPT:
                kept += entries
            elif sampled:
                end = entries[-1]["collective_seq_id"] // self._stride * self._stride
                kept += [e for e in entries if end - HISTORY_KEPT < e["collective_seq_id"] <= end]
            else:
                kept += entries[-HISTORY_KEPT:]
        kept.sort(key=record_id)
        return kept

    def _count_lines(self, entries: list) -> None:
        """How many collectives each user line issued, over every entry read so far (the python recorder counts every
        call); from each entry's frames, the first one outside torch and the libraries (sites.is_internal_file)."""
        counts = self._line_counts
        for entry in entries:
            for raw in entry.get("frames") or ():
                file = str(raw.get("filename") or "?") if isinstance(raw, dict) else "?"
                if not is_internal_file(file):
                    line = (file, raw.get("line"), str(raw.get("name") or "?"))
                    counts[line] = counts.get(line, 0) + 1
                    break

    def record_of(self, entry: dict, frame, done: bool = False):
        """A Record for one entry; `frame`: the live top frame of the thread waiting on it (its site and api), else
        the entry's own frames where the dump has them."""
        op = canonical_op(entry.get("profiling_name"))[0]
        shapes, dtypes = shapes_and_dtypes(entry, build.TENSORS_KEPT)
        created = (entry.get("time_created_ns") or 0) / 1e9
        record = record_module.Record(
            int(entry["collective_seq_id"]) - 1,
            group_of(entry),
            op,
            op,  # the api until a frame says which call it was
            None,
            tuple((tuple(shape), name) for shape, name in zip(shapes, dtypes)),
            thread_of(entry) or threading.main_thread().ident or 0,
            None,
            created - self._wall_offset if created else time.monotonic(),
            build.COMPLETED if done else build.IN_FLIGHT,
        )
        if done:
            record.end_mono = record.start_mono
        if op in catalogue.REDUCING:
            record.reduce = self._reduce_op(record.thread, entry.get("time_created_ns") or 0)
        if frame is not None:
            self._place(record, frame, op)
        else:
            self._place_dumped(record, dumped_frames(entry), op)
        return record

    def _reduce_op(self, thread: int, created_ns: int):
        """The reduce op of a reducing collective: the op noted for its call, else the default, SUM."""
        noted = self._reduce_notes.op_of(thread, created_ns) if self._reduce_notes is not None else None
        return "sum" if noted is None else noted

    def _place(self, record, frame, op: str) -> None:
        """The line, api and region of a collective from the stack of the thread waiting on it now."""
        api, region = classify(frames_of(frame), op)
        user, via = user_frame_and_via(frame)
        record.api = api
        record.site = code_site(user) if user is not None else None
        record.via = cached_via_site(via) if via is not None else None
        if region is not None:
            record.region = (region["kind"], region["site"], region["api"], None)
        else:
            record.region = self.recorder.current_region(record.thread)  # FSDP2's forward: its hook's region

    @staticmethod
    def _place_dumped(record, frames: list, op: str) -> None:
        """The line, api and region of a collective from the frames the Flight Recorder kept when it was issued."""
        site = first_user_frame(frames)
        if site is None:
            return
        record.site = (site["file"], site["line"], site["function"])
        record.api, region = classify(frames, op)
        if region is not None:
            record.region = (region["kind"], region["site"], region["api"], None)


class _NoFeed:
    """The python recorder's stand-in for a feed: the wrappers record as the training thread goes."""

    def poll(self, now: float | None = None) -> None:
        pass

    def due_in(self, now: float) -> float:
        return float("inf")

    def refresh(self, now: float | None = None, now_or_never: bool = False) -> None:
        pass


NO_FEED = _NoFeed()
