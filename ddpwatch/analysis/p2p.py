"""Point-to-point deadlocks: every rank blocked, no pending send, recv or collective can ever be matched, and the
ranks wait for one another in a cycle. Plain data in, a finding's facts out."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ..catalogue import P2P_COUNTS_KEPT
from .passes import finding
from .reading import code_of, members, user_line_now, user_location, waits_in

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import Site

SEND, RECV, COLLECTIVE = "send", "recv", "collective"
ANY_SOURCE = -1  # a recv without `src`: any rank's send to this one matches it

# The shapes of a cycle, each with its own fix (render/wording.py words them).
SEND_FIRST = "send_first"  # every rank of the cycle sends first; nobody receives
RECV_FIRST = "recv_first"  # every rank of the cycle waits to receive first; nobody sends
UNMATCHED = "unmatched"  # a send and a recv between the same two ranks that differ in tag or source
INTO_COLLECTIVE = "into_collective"  # a peer sits in a collective the sender (or receiver) never joins
CROSSED = "crossed"  # sends and receives waited in an order that closes a cycle
PIPELINE = "pipeline"  # the sends and receives of torch.distributed.pipelining's schedule: its stages disagree
PIPELINING = "torch.distributed.pipelining"  # a record's origin when that library issued it


class Pending(NamedTuple):
    """One operation a rank has in flight: a point-to-point half (send/recv) or a collective."""

    rank: int
    kind: str  # SEND, RECV or COLLECTIVE
    peer: int | None  # the other rank of a send/recv (ANY_SOURCE for a recv from anyone); None for a collective
    tag: int | None  # None: not known (a Flight Recorder record, NCCL) - matches any tag
    record: dict


def pending_ops(rank: int, state: dict) -> list:
    """Every operation `rank` has in flight, a batch_isend_irecv record split into its sends and receives."""
    found = []
    for record in state.get("inflight") or ():
        if not record.get("p2p"):
            found.append(Pending(rank, COLLECTIVE, None, None, record))
        elif record.get("ops"):
            found.extend(
                Pending(rank, op.get("op"), op.get("peer"), op.get("tag"), record)
                for op in record["ops"]
                if op.get("op") in (SEND, RECV)
            )
        elif record.get("op") in (SEND, RECV) and isinstance(record.get("peer"), int) and record["peer"] >= -1:
            found.append(Pending(rank, record["op"], record["peer"], record.get("tag"), record))
    return found


def is_waiting_in_call(state: dict) -> bool:
    """Whether the rank is surely inside a wait: a call still running (send, recv, a collective), or a thread in
    wait() on an isend/irecv's Work. An isend or irecv merely in flight while the rank computes is not a wait."""
    return any(waits_in(record) for record in state.get("inflight") or ())


def blocking_ops(ops: list) -> list:
    """The operations the rank is actually stuck in: those of calls running or waited on (see is_waiting_in_call)."""
    return [op for op in ops if waits_in(op.record)]


def _same_group(a: Pending, b: Pending) -> bool:
    return a.record.get("group") == b.record.get("group")


def p2p_match(a: Pending, b: Pending) -> bool:
    """Whether a send and a recv of two ranks pair up: each names the other (or the recv takes any source), same
    group, same tag (an unknown tag matches)."""
    if {a.kind, b.kind} != {SEND, RECV} or a.rank == b.rank or not _same_group(a, b):
        return False
    send, recv = (a, b) if a.kind == SEND else (b, a)
    tags_agree = send.tag is None or recv.tag is None or send.tag == recv.tag
    return send.peer == recv.rank and recv.peer in (ANY_SOURCE, send.rank) and tags_agree


class Absent:
    """The members of a collective's group that do not have it (its group and position) in flight, asked per op and
    read once per position: a hang of thousands of ranks in one collective asks it once per rank."""

    def __init__(self, ops_by_rank: dict, states: dict, world_size: int):
        self.states, self.world_size = states, world_size
        self.holding: dict = {}  # (group, seq) -> the ranks with that collective in flight
        for rank, ops in ops_by_rank.items():
            for o in ops:
                if o.kind == COLLECTIVE:
                    self.holding.setdefault((o.record.get("group"), o.record.get("seq")), set()).add(rank)
        self._found: dict = {}

    def __call__(self, op: Pending) -> list:
        position = (op.record.get("group"), op.record.get("seq"))
        if position not in self._found:
            holding = self.holding.get(position, set())
            group_members = members(self.states, position[0], self.world_size)
            self._found[position] = [member for member in group_members if member not in holding]
        return self._found[position]


def _partners(op: Pending, ops_by_rank: dict):
    """(rank, its ops) of the ranks whose ops can pair with a send or recv: its peer's, or every rank's for a recv
    from any source (p2p_match asks the rest)."""
    if op.kind == RECV and op.peer == ANY_SOURCE:
        return ops_by_rank.items()
    return ((op.peer, ops_by_rank.get(op.peer, ())),)


def can_complete(op: Pending, ops_by_rank: dict, absent: Absent) -> bool:
    """A collective: every member has it in flight; a send or recv: a pending op of another rank pairs with it."""
    if op.kind == COLLECTIVE:
        return not absent(op)
    return any(
        p2p_match(op, other) for rank, others in _partners(op, ops_by_rank) if rank != op.rank for other in others
    )


def needs(op: Pending, ops_by_rank: dict, absent: Absent) -> list:
    """The ranks this operation waits for: its peer, any rank for an any-source recv, or the group's members that
    are not in this collective at this position."""
    if op.kind == COLLECTIVE:
        return [m for m in absent(op) if m != op.rank]
    if op.peer == ANY_SOURCE:
        return sorted(r for r in ops_by_rank if r != op.rank)
    return [op.peer]


def wait_cycle(blocking: dict, ops_by_rank: dict, absent: Absent) -> list:
    """[(rank, the op it waits in, the rank it waits for), ...] closing a cycle, from the lowest rank that is on
    one; [] when the waits end outside the blocked ranks (a rank that exited, or one not seen)."""
    edges = {
        rank: [(op, peer) for op in ops for peer in needs(op, ops_by_rank, absent)] for rank, ops in blocking.items()
    }
    for start in sorted(edges):
        path: list[tuple] = []  # (rank, op, the rank it waits for)
        seen: dict[int, int] = {}  # rank -> its index in path
        rank = start
        while rank in edges and rank not in seen and edges[rank]:
            seen[rank] = len(path)
            op, peer = _preferred_edge(edges[rank], seen)
            path.append((rank, op, peer))
            rank = peer
        if rank in seen:
            return path[seen[rank] :]
    return []


def _preferred_edge(edges: list, seen: dict) -> tuple:
    """Follow a point-to-point wait first (the cycle the user wrote), then one back to a rank on the path."""
    return min(edges, key=lambda e: (e[0].kind == COLLECTIVE, e[1] not in seen, e[1]))


def cycle_shape(cycle: list, ops_by_rank: dict) -> tuple:
    """(shape, the unmatched pair or None) of a wait-for cycle."""
    kinds = {op.kind for _, op, _ in cycle}
    if all(op.record.get("origin") == PIPELINING for _, op, _ in cycle if op.kind != COLLECTIVE):
        return PIPELINE, None  # the schedule is the library's: its stages disagree, whatever the shape
    pair = _unmatched_pair(cycle, ops_by_rank)
    if pair:
        return UNMATCHED, pair
    if COLLECTIVE in kinds:
        return INTO_COLLECTIVE, None
    if kinds == {SEND}:
        return SEND_FIRST, None
    if kinds == {RECV}:
        return RECV_FIRST, None
    return CROSSED, None


def _unmatched_pair(cycle: list, ops_by_rank: dict):
    """A send to a rank whose pending recv differs from it only in tag or source: on the cycle first, else
    anywhere (rank 0 sends to rank 1, which waits for rank 2: the cycle runs through rank 2, the bug is the pair)."""
    on_cycle = [op for _, op, _ in cycle]
    everywhere = [op for ops in ops_by_rank.values() for op in ops]
    for candidates in (on_cycle, everywhere):
        for op in candidates:
            if op.kind != SEND:
                continue
            for other in ops_by_rank.get(op.peer, ()):
                if other.kind == RECV and _same_group(op, other) and _near_miss(op, other):
                    return op, other
    return None


def _near_miss(a: Pending, b: Pending) -> bool:
    """A send and a recv between the same two ranks that would pair but for the tag, or a recv that names
    another source while this rank sends to it."""
    send, recv = (a, b) if a.kind == SEND else (b, a)
    if send.peer != recv.rank:
        return False
    return recv.peer not in (ANY_SOURCE, send.rank) or (
        send.tag is not None and recv.tag is not None and send.tag != recv.tag
    )


def count_of(state: dict, group, op: str, peer: int) -> int | None:
    """How many sends to (op "send") or receives from (op "recv") `peer` this rank began on `group`, from its
    published counters (a receive from any source counts as one from every peer); None when it published none."""
    counts = state.get("p2p_counts")
    if not isinstance(counts, dict):
        return None
    found = [counts.get(f"{group}:{op}:{peer}")] + ([counts.get(f"{group}:{op}:{ANY_SOURCE}")] if op == RECV else [])
    return sum(n for n in found if isinstance(n, int))


def culprits_of(shape: str, cycle: list, pair, went_on: list) -> list:
    """The receiver of an unmatched pair and its sender; the ranks that went on without a half their peer waits for
    where the source shows the way past it (`went_on`); otherwise every rank of the cycle: for a peer gone on to a
    collective, one side sent or asked for one message more than the other will handle, and which side's count is
    wrong is the program's to say (the summary gives both counts)."""
    if shape == UNMATCHED:
        return sorted({pair[0].rank, pair[1].rank})
    if went_on:
        return sorted({gone["rank"] for gone in went_on})
    return sorted({rank for rank, _, _ in cycle})


def went_on_without(steps: list, states: dict) -> list:
    """Ranks of the cycle that stand in a collective while a peer waits for their send (or recv), and began fewer of
    those than the peer began of its half, by the counts both published (observed in the run): the rank went on
    without it. Each: {rank, peer, half (what it did not do), count (its own), peer_count}."""
    in_collective = {step["rank"] for step in steps if step["kind"] == COLLECTIVE}
    found = []
    for step in steps:
        gone = step["waits_for"]
        if step["kind"] not in (SEND, RECV) or gone not in in_collective or not _counted(states.get(gone)):
            continue
        mine, theirs = step.get("count"), step.get("peer_count")
        if isinstance(mine, int) and isinstance(theirs, int) and theirs < mine:
            half = RECV if step["kind"] == SEND else SEND
            found.append({"rank": gone, "peer": step["rank"], "half": half, "count": theirs, "peer_count": mine})
    return found


def _counted(state: dict | None) -> bool:
    """Whether a pair missing from the rank's p2p_counts means none (the table was not full)."""
    counts = (state or {}).get("p2p_counts")
    return isinstance(counts, dict) and len(counts) < P2P_COUNTS_KEPT


def exit_before_half(gone: dict, group, states: dict) -> dict | None:
    """Read from the source: where the code that issues the missing half (`gone`'s own earlier sends to that peer,
    else another rank's: the ranks run the same code) can leave before it - a `return` of its function, or a
    `continue`/`break` of a loop around it, under a condition that does not test the rank, on a line before the
    half's. The nearest one."""
    code = code_of(states)
    for site in _half_sites(gone, group, states):
        around = code.get(f"{site['file']}:{site['line']}")
        if not isinstance(around, dict):
            continue
        first = around["function"][0]
        exits = [e for e in around.get("returns") or () if e["kind"]]
        exits += [e for loop in around.get("loops") or () for e in loop["exits"] if e["kind"] in ("continue", "break")]
        # under a condition on data, not on the rank: `if is_last_stage: return` is the program's shape, the same
        # every round, where a rank that went on without its half decided on something it held that round
        before = [
            e
            for e in exits
            if first <= e["line"] < site["line"] and e.get("condition") and not e["condition"].get("rank")
        ]
        if before:
            chosen = max(before, key=lambda e: e["line"])
            return {
                "kind": chosen["kind"],
                "site": {"file": site["file"], "line": chosen["line"], "function": site.get("function")},
                "condition": chosen["condition"].get("text"),
                "half_site": site,
                "half_of": site["rank"],
            }
    return None


def _half_sites(gone: dict, group, states: dict) -> list:
    """The user's lines of the sends (or recvs) to `gone`'s peer on `group`: its own first, then other ranks'."""
    ranks = [gone["rank"]] + sorted(r for r in states if r not in (gone["rank"], gone["peer"]))
    found: list = []
    for rank in ranks:
        for record in (states.get(rank) or {}).get("recent") or ():
            if not isinstance(record, dict) or record.get("group") != group:
                continue
            ops = record.get("ops") or [record]
            if any(op.get("op") == gone["half"] and op.get("peer") == gone["peer"] for op in ops):
                site = user_location(record)
                seen = {(f["file"], f["line"]) for f in found}
                if site and isinstance(site.get("line"), int) and (site.get("file"), site["line"]) not in seen:
                    found.append(dict(site, rank=rank))
    return found


def step_of(rank: int, op: Pending, peer: int, states: dict) -> dict:
    """One step of the cycle as facts: who, in what, at which line (and, for an isend/irecv waited on, the line
    where it waits), waiting for whom, and for a send or recv the counts on both sides."""
    record, state = op.record, states.get(rank)
    step = {
        "rank": rank,
        "kind": op.kind,
        "peer": op.peer,
        "tag": op.tag,
        "waits_for": peer,
        "op": record.get("op"),
        "api": record.get("api"),
        "group": record.get("group"),
        "seq": record.get("seq"),
        "site": user_location(record),
        "wait_s": record.get("age_s"),
        "batch": bool(record.get("ops")),
        "wait_site": user_line_now(state) if state and record.get("waited") else None,
    }
    if op.kind != COLLECTIVE and op.peer is not None and op.peer != ANY_SOURCE and op.peer in states:
        other = SEND if op.kind == RECV else RECV
        step["count"] = count_of(state or {}, record.get("group"), op.kind, op.peer)  # this one included
        step["peer_count"] = count_of(states[op.peer], record.get("group"), other, rank)
    return step


def _where(step: dict) -> Site | None:
    """The line a person should look at for a step: where it waits, else where it was issued."""
    return step.get("wait_site") or step["site"]


def p2p_deadlock(waiting: dict, states: dict, world_size: int) -> dict | None:
    """Every live rank blocked, at least one in a send or recv, and nothing pending can ever be matched: the wait-
    for cycle, who departed, and the shape of the cycle (which decides the fix)."""
    if not any(record.get("p2p") for state in states.values() for record in state.get("inflight") or ()):
        return None  # no send or recv in flight anywhere: asked first, since a hang of many ranks gets here
    ops_by_rank = {rank: pending_ops(rank, state) for rank, state in states.items()}
    if not any(op.kind != COLLECTIVE for ops in ops_by_rank.values() for op in ops):
        return None
    if not all(is_waiting_in_call(state) for state in states.values()):
        return None  # a rank computing with an irecv posted may yet send what another waits for
    absent = Absent(ops_by_rank, states, world_size)
    if any(can_complete(op, ops_by_rank, absent) for ops in ops_by_rank.values() for op in ops):
        return None  # a pair or a collective can still finish: slow, not proven stuck
    blocking = {rank: blocking_ops(ops) for rank, ops in ops_by_rank.items()}
    cycle = wait_cycle(blocking, ops_by_rank, absent)
    if not cycle or all(op.kind == COLLECTIVE for _, op, _ in cycle):
        return None  # collectives alone: group_order and the mismatch passes say it better
    shape, pair = cycle_shape(cycle, ops_by_rank)
    steps = [step_of(rank, op, peer, states) for rank, op, peer in cycle]
    # The rank that went on is the culprit where the source shows a way past its half; with no such exit (stages
    # of a pipeline that disagree on a count) which side is wrong stays the program's to say.
    went_on = [
        dict(gone, exit=left)
        for gone in (went_on_without(steps, states) if shape == INTO_COLLECTIVE else [])
        if (left := exit_before_half(gone, next(s["group"] for s in steps if s["rank"] == gone["peer"]), states))
    ]
    culprits = culprits_of(shape, cycle, pair, went_on)
    pair_facts = None if not pair else [step_of(op.rank, op, op.peer, states) for op in pair]
    if pair_facts:
        location = _where(pair_facts[1])
    elif went_on:  # where the rank that went on can leave before its half, read from the source
        location = went_on[0]["exit"]["site"]
    else:
        location = next(_where(s) for s in steps if s["kind"] != COLLECTIVE)
    side = [op.record for _, op, _ in cycle]
    rows = [
        {
            "ranks": [step["rank"]],
            "group": step["group"],
            "seq": step["seq"],
            "op": step["op"],
            "api": step["api"],
            "shapes": op.record.get("shapes"),
            "dtypes": op.record.get("dtypes"),
            "site": op.record.get("site"),
            "region": op.record.get("region"),
            "wait_s": step["wait_s"],
            "state": op.record.get("state"),
            "description": None,
        }
        for step, (_, op, _) in zip(steps, cycle)
    ]
    return finding(
        "p2p_deadlock",
        culprits,
        location,
        {"shape": shape, "cycle": steps, "mismatched": rows}
        | ({"went_on": went_on, "culprit_rule": "went_on"} if went_on else {}),
        shape=shape,
        cycle=steps,
        went_on=went_on,
        pair=pair_facts,
        culprits=culprits,
        location=location,
        side=side,
    )
