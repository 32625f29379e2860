"""Hand-made rank snapshots and incidents for the fast, torch-free tests (plain dicts in ddpwatch's formats).

Sites are given as (file, line, function) tuples; a bare file name is placed under /u/ (the user's code).
"""

from __future__ import annotations

DEFAULT_SITE = ("train.py", 72, "train")
TORCH_FILE = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
DDP_FILE = "/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py"


def as_site(where) -> dict | None:
    """(file, line, function) or a site dict -> a site dict; None stays None."""
    if where is None or isinstance(where, dict):
        return where
    file, line, function = where
    if "/" not in file:
        file = "/u/" + file
    return {"file": file, "line": line, "function": function}


def ddp_region(where=("val.py", 42, "validate"), api="DistributedDataParallel.forward") -> dict:
    return {"kind": "ddp_forward", "site": as_site(where), "api": api}


def object_region(where, api="all_gather_object") -> dict:
    return {"kind": "object_collective", "site": as_site(where), "api": api}


def rec(seq, op, api=None, group="0", site=DEFAULT_SITE, region=None, age=3.0, state="in_flight",
        shapes=None, dtypes=None, peer=None, thread="MainThread", error=None) -> dict:
    """One record; api defaults to the op's own name (a plain dist.<op> call)."""
    if shapes is None:
        shapes = [] if op == "barrier" else [[8]]
    if dtypes is None:
        dtypes = ["float32"] * len(shapes)
    return {
        "seq": seq,
        "group": group,
        "op": op,
        "api": op if api is None else api,
        "p2p": peer is not None,
        "peer": peer,
        "shapes": [list(s) for s in shapes],
        "dtypes": list(dtypes),
        "site": as_site(site),
        "region": region,
        "start": 1_700_000_000.0,
        "age_s": age,
        "duration_s": None if state == "in_flight" else 0.001,
        "state": state,
        "error": error,
        "thread": thread,
    }


def done(seq, op, **kw) -> dict:
    """A completed record (history)."""
    kw.setdefault("age", 30.0)
    return rec(seq, op, state="completed", **kw)


def frame(where, internal=False) -> dict:
    s = as_site(where)
    return {"file": s["file"], "line": s["line"], "function": s["function"], "internal": internal}


def main_stack(*frames) -> dict:
    """frames: outermost first; each (file, line, function) [user] or (file, line, function, True) [internal]."""
    built = [frame(f[:3], internal=len(f) > 3 and f[3]) for f in frames]
    return {"thread": "MainThread", "main": True, "frames": built}


def _waiting(inflight):
    pool = [r for r in inflight if not r.get("p2p")] or list(inflight)
    return max(pool, key=lambda r: r["age_s"]) if pool else None


def default_stacks(inflight, user_line=DEFAULT_SITE) -> list:
    """A plausible main-thread stack: main() -> the user's line -> (torch internals when waiting)."""
    record = _waiting(inflight)
    frames = [("train.py", 120, "main")]
    if record is None:
        frames.append(user_line)
    else:
        region = record.get("region")
        where = (region or {}).get("site") or record["site"]
        frames.append((where["file"], where["line"], where["function"]))
        if region:
            frames.append((DDP_FILE, 1600, "forward", True))
        frames.append((TORCH_FILE, 2400, record["api"], True))
        frames.append((TORCH_FILE, 80, "wrapper", True))
    return [main_stack(*frames)]


def rank_state(rank, world_size, inflight=(), recent=(), idle=3.0, stacks=None, status="running",
               groups=None, user_line=DEFAULT_SITE, host="node0", pid=None) -> dict:
    inflight, recent = list(inflight), list(recent)
    last_seq: dict = {}
    for r in recent + inflight:
        if not r.get("p2p"):
            last_seq[r["group"]] = max(last_seq.get(r["group"], -1), r["seq"])
    if groups is None:
        groups = {g: None for g in {r["group"] for r in recent + inflight} | {"0"}}
    return {
        "format_version": 1,
        "rank": rank,
        "world_size": world_size,
        "pid": 1000 + rank if pid is None else pid,
        "host": host,
        "beat": 5,
        "published_at": 1_700_000_100.0,
        "status": status,
        "progress": 2 * len(recent) + len(inflight),
        "idle_s": idle,
        "inflight": inflight,
        "recent": recent,
        "last_seq": {str(k): v for k, v in last_seq.items()},
        "groups": groups,
        "ops_recorded": 2 * len(recent) + len(inflight),
        "stacks": default_stacks(inflight, user_line) if stacks is None else stacks,
    }


def states(*rank_states) -> dict:
    return {s["rank"]: s for s in rank_states}


# ---------------------------------------------------------------- the seed stall and friends

SEED_VAL = ("val.py", 42, "validate")       # rank 0 calls the DDP model here, in an `if rank == 0:` branch
SEED_BARRIER = ("train.py", 88, "train")    # everyone else waits here
SEED_SEQ = 11
# The record's own site is deliberately not the DDP call site, so that a test can tell which one was reported.
DDP_INTERNAL_SITE = (DDP_FILE, 1400, "_sync_buffers")


def ddp_broadcast(seq=SEED_SEQ, call_site=SEED_VAL, api="_broadcast_coalesced", age=3.0, **kw) -> dict:
    return rec(seq, "broadcast", api=api, site=DDP_INTERNAL_SITE, region=ddp_region(call_site), age=age, **kw)


def barrier(seq=SEED_SEQ, where=SEED_BARRIER, age=3.0, **kw) -> dict:
    return rec(seq, "barrier", site=where, age=age, **kw)


def seed_states(world_size=2, api="_broadcast_coalesced", age=3.0, idle=3.0) -> dict:
    """Rank 0 blocks in DDP's buffer broadcast inside model(x) at val.py:42; the rest wait at train.py:88."""
    out = [rank_state(0, world_size, inflight=[ddp_broadcast(api=api, age=age)], idle=idle)]
    out += [rank_state(r, world_size, inflight=[barrier(age=age)], idle=idle) for r in range(1, world_size)]
    return states(*out)


def incident(states_by_rank: dict, findings: list, trigger="deadlock", run_id="20250101-120000-job7",
             world_size=None, grace=2.0, timeout=300.0, written_by=0, missing=()) -> dict:
    return {
        "format_version": 1,
        "run_id": run_id,
        "world_size": len(states_by_rank) + len(missing) if world_size is None else world_size,
        "created_at": 1_700_000_200.0,
        "trigger": trigger,
        "written_by": written_by,
        "grace": grace,
        "timeout": timeout,
        "ranks": [states_by_rank[r] for r in sorted(states_by_rank)],
        "missing_ranks": list(missing),
        "findings": findings,
    }
