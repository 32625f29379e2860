"""Hand-made rank snapshots and incidents for the fast, torch-free tests (plain dicts in ddpwatch's formats).

Sites are given as (file, line, function) tuples; a bare file name is placed under /u/ (the user's code).
"""

from __future__ import annotations

from typing import NamedTuple

from ddpwatch.render.wording import worded

DEFAULT_SITE = ("train.py", 72, "train")
TORCH_FILE = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
DDP_FILE = "/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py"
PATCH_FILE = "/opt/venv/lib/python3.11/site-packages/ddpwatch/capture/wrappers.py"


def as_site(where) -> dict | None:
    """(file, line, function) or a site dict -> a site dict; None stays None."""
    if where is None or isinstance(where, dict):
        return where
    file, line, function = where
    if "/" not in file and not file.startswith("<"):  # "<ddpwatch hot path: barrier>" names no file
        file = "/u/" + file
    return {"file": file, "line": line, "function": function}


def ddp_region(where=("val.py", 42, "validate"), api="DistributedDataParallel.forward") -> dict:
    return {"kind": "ddp_forward", "site": as_site(where), "api": api}


def object_region(where, api="all_gather_object") -> dict:
    return {"kind": "object_collective", "site": as_site(where), "api": api}


def rec(
    seq,
    op,
    api=None,
    group="0",
    site=DEFAULT_SITE,
    region=None,
    age=3.0,
    state="in_flight",
    shapes=None,
    dtypes=None,
    peer=None,
    thread="MainThread",
    error=None,
) -> dict:
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


def wrapped_stack() -> dict:
    """Rank 0's main stack in the seed stall with ddpwatch's own frames, shaped like a real report's: 3 of them (its
    package's files and a generated hot-path wrapper) between the user's line and torch's, 3 innermost."""
    return main_stack(
        ("train.py", 120, "main"),
        ("val.py", 42, "validate"),
        (PATCH_FILE, 524, "forward", True),
        (PATCH_FILE, 512, "wrapper", True),
        ("<ddpwatch hot path: broadcast>", 32, "broadcast", True),
        (DDP_FILE, 1600, "forward", True),
        (TORCH_FILE, 2400, "_broadcast_coalesced", True),
        (PATCH_FILE, 287, "wrapper", True),
        (PATCH_FILE, 474, "body", True),
        (PATCH_FILE, 296, "_finish_on_error", True),
    )


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


def rank_state(
    rank,
    world_size,
    inflight=(),
    recent=(),
    idle=3.0,
    stacks=None,
    status="running",
    groups=None,
    user_line=DEFAULT_SITE,
    host="node0",
    pid=None,
) -> dict:
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

SEED_VAL = ("val.py", 42, "validate")  # rank 0 calls the DDP model here, in an `if rank == 0:` branch
SEED_BARRIER = ("train.py", 88, "train")  # everyone else waits here
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


# ---------------------------------------------------------------- one hand-built trace per finding kind


class Trace(NamedTuple):
    """What assess() is given: the ranks' states, the world size and the ranks whose heartbeat stopped."""

    states: dict
    world_size: int
    silent: dict | None = None


def _two(inflight0, inflight1, **kw) -> Trace:
    return Trace(states(rank_state(0, 2, inflight=inflight0, **kw), rank_state(1, 2, inflight=inflight1, **kw)), 2)


def trace_lone_barrier() -> Trace:
    """Rank 0 in an all_reduce, rank 1 in a barrier: the side not in the barrier called what the other does not."""
    return _two([rec(4, "all_reduce", site=("x.py", 10, "f"))], [rec(4, "barrier", site=("x.py", 20, "f"))])


def trace_different_collectives() -> Trace:
    """One rank each in an all_reduce and a broadcast from lines nobody ran before: no rule names a culprit."""
    return _two([rec(4, "all_reduce", site=("x.py", 10, "f"))], [rec(4, "broadcast", site=("x.py", 20, "f"))])


def trace_different_positions() -> Trace:
    """Rank 1 already at seq 5 of the group while rank 0 waits at seq 4, with no record of its own seq 4."""
    return _two([rec(4, "all_reduce", site=("x.py", 10, "f"))], [rec(5, "all_reduce", site=("x.py", 10, "f"))])


def trace_empty_tensor() -> Trace:
    """The same all_reduce at the same line, rank 1 with an empty tensor."""
    return _two(
        [rec(4, "all_reduce", site=("x.py", 10, "f"), shapes=[[8]])],
        [rec(4, "all_reduce", site=("x.py", 10, "f"), shapes=[[0]])],
    )


def trace_shape_mismatch_in_ddp_forward() -> Trace:
    """Rank 0's broadcast runs inside DDP.forward with 8 elements, rank 1's outside it with 4: two rules apply."""
    inside = rec(SEED_SEQ, "broadcast", site=DDP_INTERNAL_SITE, region=ddp_region(SEED_VAL), shapes=[[8]])
    return _two([inside], [rec(SEED_SEQ, "broadcast", site=SEED_BARRIER, shapes=[[4]])])


def trace_groups_in_opposite_orders() -> Trace:
    """Ranks 0 and 1 share groups A and B; rank 0 waits on A, rank 1 on B."""
    groups = {"A": [0, 1], "B": [0, 1]}
    return _two(
        [rec(3, "all_reduce", group="A", site=("x.py", 10, "f"))],
        [rec(3, "all_reduce", group="B", site=("x.py", 12, "f"))],
        groups=groups,
    )


def training_history(last_seq, matched_after_loop) -> list:
    """Six DDP steps (gradient all-reduces) before `last_seq`, then maybe a barrier every rank matched after them."""
    recent = [
        done(s, "all_reduce", api="DDP.backward_all_reduce", site=("train.py", 20, "train"))
        for s in range(last_seq - 6, last_seq)
    ]
    if matched_after_loop:
        recent.append(done(last_seq, "barrier", site=("train.py", 30, "train")))
    return recent


def trace_extra_training_step() -> Trace:
    """Rank 0 runs a seventh training step while rank 1 finished the loop and waits in the barrier after it."""
    step = rec(10, "all_reduce", api="DDP.backward_all_reduce", site=("train.py", 20, "train"))
    after = rec(10, "barrier", site=("train.py", 33, "train"))
    return _two([step], [after], recent=training_history(10, False))


def trace_skip_after_matched_barrier() -> Trace:
    """Both ranks left the loop together (matched barrier at seq 10); rank 1 skipped the next barrier."""
    step = rec(11, "all_reduce", api="DDP.backward_all_reduce", site=("train.py", 20, "train"))
    after = rec(11, "barrier", site=("train.py", 33, "train"))
    return _two([after], [step], recent=training_history(10, True))


def trace_exited_peer() -> Trace:
    """Rank 0 waits in a barrier; rank 1 has exited."""
    return Trace(
        states(
            rank_state(0, 2, inflight=[rec(9, "barrier", site=("train.py", 41, "f"))]),
            rank_state(1, 2, status="exited"),
        ),
        2,
    )


def trace_busy_peer(wait=400.0) -> Trace:
    """Rank 0 works outside collectives at val.py:40 while rank 1 has waited `wait` seconds in a barrier."""
    return Trace(
        states(
            rank_state(0, 2, idle=wait, user_line=("val.py", 40, "v")),
            rank_state(1, 2, inflight=[barrier(age=wait)], idle=wait),
        ),
        2,
    )


def trace_everyone_in_one_call(wait=400.0) -> Trace:
    """Both ranks have waited `wait` seconds in the same all_reduce."""
    return Trace(states(*[rank_state(r, 2, inflight=[rec(3, "all_reduce", age=wait)], idle=wait) for r in (0, 1)]), 2)


def trace_silent_peer(process: dict) -> Trace:
    """Rank 0 waits in a barrier; rank 1's heartbeat stopped 15 s ago; `process`: what psutil says of it."""
    waiting = rank_state(0, 2, inflight=[rec(5, "barrier", age=20.0)], idle=20.0)
    last = rank_state(1, 2, inflight=[rec(4, "barrier", state="completed")], idle=0.1, pid=4242)
    return Trace(states(waiting), 2, {1: {"silent_s": 15.0, "last_state": last, "process": process}})


def trace_vanished_peer() -> Trace:
    return trace_silent_peer({"exists": False})


def trace_stopped_peer() -> Trace:
    return trace_silent_peer({"exists": True, "status": "stopped"})


def incident(
    states_by_rank: dict,
    findings: list,
    trigger="deadlock",
    run_id="20250101-120000-job7",
    world_size=None,
    grace=2.0,
    timeout=300.0,
    written_by=0,
    missing=(),
) -> dict:
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
        "findings": [worded(f) for f in findings],  # as report.json holds them: summary and fix in words
    }


# ---------------------------------------------------------------- point-to-point


def p2p(seq, op, peer, tag=0, api=None, site=("halo.py", 12, "exchange"), age=3.0, waited=None, ops=None, **kw) -> dict:
    """A send/recv record (seq: the per-pair position); `api` isend/irecv/batch_isend_irecv makes it async, and
    `waited` says whether a thread waits on its Work now."""
    record = rec(seq, op, api=api, site=site, age=age, peer=peer, **kw)
    record["tag"] = tag
    if ops is not None:
        record["ops"] = [{"op": o, "peer": p, "tag": t} for o, p, t in ops]
    if record["api"] in ("isend", "irecv", "batch_isend_irecv"):
        record["async"] = True
        record["waited"] = bool(waited)
    return record


def trace_send_cycle() -> Trace:
    """A halo exchange written send-then-recv: both ranks block in send to the other."""
    return _two([p2p(0, "send", 1)], [p2p(0, "send", 0)])


# ---------------------------------------------------------------- control flow that departs (analysis/departure.py)


def code_of(source: str, lines, file="train.py") -> dict:
    """A rank state's `code` for `lines` of `source` (as static.exits reads them when an incident is taken)."""
    from ddpwatch.static.exits import code_around_source

    return {f"{as_site((file, 1, 'f'))['file']}:{line}": code_around_source(source, line) for line in lines}


def grad_sync(seq, line, age=3.0, state="in_flight", file="train.py", function="train") -> dict:
    return rec(seq, "all_reduce", api="DDP.backward_all_reduce", site=(file, line, function), age=age, state=state)


def forward_sync(seq, line, age=3.0, state="in_flight", file="train.py", function="train") -> dict:
    return ddp_broadcast(seq=seq, call_site=(file, line, function), age=age, state=state)


def departed_state(rank, world_size, history, waiting, frames, code=None, epochs=None) -> dict:
    """A rank with `history` (completed records), waiting in `waiting`, its main stack's user `frames` (outermost
    first), and what the source and its DataLoaders said (`code`, `epochs`)."""
    stack = main_stack(*frames, (TORCH_FILE, 2400, waiting["api"], True))
    state = rank_state(rank, world_size, inflight=[waiting], recent=history, stacks=[stack])
    if code is not None:
        state["code"] = code
    if epochs is not None:
        state["epochs"] = epochs
    return state


EARLY_STOP_SOURCE = """def train(model, data, stopper):
    for epoch in range(20):
        for x, y in data:
            loss = model(x).sum()
            loss.backward()
        if stopper.should_stop(local_val_loss()):
            break
    dist.barrier()
"""


def trace_early_stop(
    epochs=((2, [4, 4]), (3, [4, 4, 1])), source=EARLY_STOP_SOURCE, step=5, after=("train.py", 8, "train")
) -> Trace:
    """Rank 0 breaks out of the epoch loop on its own validation loss after 2 epochs of 4 steps (backward at line
    `step`) and waits at `after`; rank 1 trains on."""
    code = code_of(source, (step, after[1]))
    history = [
        done(s, "all_reduce", api="DDP.backward_all_reduce", site=("train.py", step, "train")) for s in range(2, 10)
    ]
    loaders = [None if e is None else [{"loader": 0, "epochs": e[0], "steps": list(e[1])}] for e in epochs]
    main = ("main.py", 30, "main")
    return Trace(
        states(
            departed_state(0, 2, history, barrier(10, after), [main, after], code, loaders[0]),
            departed_state(1, 2, history, grad_sync(10, step), [main, ("train.py", step, "train")], code, loaders[1]),
        ),
        2,
    )


CAUGHT_SOURCE = """def train(model, data):
    for x, y in data:
        try:
            loss = checked(model(x), y)
        except ValueError:
            continue
        loss.backward()
    dist.barrier()
"""


def _steps(count, forward_line, backward_line, file="train.py", function="train") -> list:
    """`count` training steps: the forward's buffer broadcast, then the gradient all-reduce."""
    out = []
    for step in range(count):
        out.append(forward_sync(2 * step, forward_line, age=30.0, state="completed", file=file, function=function))
        out.append(grad_sync(2 * step + 1, backward_line, age=30.0, state="completed", file=file, function=function))
    return out


def trace_caught_exception(source=CAUGHT_SOURCE, forward_line=4, backward_line=7) -> Trace:
    """Rank 1's forward raised after DDP broadcast the buffers; `except ValueError: continue` skipped backward."""
    code = code_of(source, (forward_line, backward_line))
    history = _steps(2, forward_line, backward_line) + [forward_sync(4, forward_line, age=30.0, state="completed")]
    main = ("main.py", 30, "main")
    return Trace(
        states(
            departed_state(
                0, 2, history, grad_sync(5, backward_line), [main, ("train.py", backward_line, "train")], code
            ),
            departed_state(
                1, 2, history, forward_sync(5, forward_line), [main, ("train.py", forward_line, "train")], code
            ),
        ),
        2,
    )


NAN_RETURN_SOURCE = """def train_until_nan(model, data):
    for x, y in data:
        loss = model(x).sum()
        if not torch.isfinite(loss):
            return
        loss.backward()


def main():
    train_until_nan(model, data)
    dist.barrier()
"""


def trace_nan_return(source=NAN_RETURN_SOURCE) -> Trace:
    """Rank 1 returns from its training function on a NaN loss, between forward and backward; rank 0 trains on."""
    code = code_of(source, (3, 6, 10, 11))
    history = _steps(2, 3, 6, function="train_until_nan") + [
        forward_sync(4, 3, age=30.0, state="completed", function="train_until_nan")
    ]
    return Trace(
        states(
            departed_state(
                0,
                2,
                history,
                grad_sync(5, 6, function="train_until_nan"),
                [("train.py", 10, "main"), ("train.py", 6, "train_until_nan")],
                code,
            ),
            departed_state(1, 2, history, barrier(5, ("train.py", 11, "main")), [("train.py", 11, "main")], code),
        ),
        2,
    )


COUNTED_STOP_SOURCE = """def train(model, data, stopper):
    for epoch in range(EPOCHS):
        for step in range(8):
            loss = model(next(data)).sum()
            loss.backward()
        if stopper.should_stop(local_val_acc()):
            break
    dist.barrier()
"""


def trace_counted_early_stop(source=COUNTED_STOP_SOURCE) -> Trace:
    """Rank 0 breaks out of loops over `range()` (no DataLoader) on its own validation accuracy; rank 1 trains on."""
    return trace_early_stop(epochs=(None, None), source=source)


SKIPPED_SOURCE = """def train(model, optimizer):
    for step in range(4):
        for micro, x, lengths in micro_batches(step):
            try:
                anchors = sample_anchors(lengths)
            except NoValidAnchorsError:
                continue
            model(x)[anchors].sum().backward()
        optimizer.step()
    dist.barrier()


def micro_batches(step):
    for micro in range(ACCUMULATION):
        yield micro, load(step, micro), lengths_of(step, micro)
"""


def trace_skipped_iteration(source=SKIPPED_SOURCE, epochs=(None, None)) -> Trace:
    """Rank 1 caught an exception in an earlier micro-batch and skipped its training step; both loops run as many
    iterations on every rank, so rank 1 finished them one step short and waits in the barrier after them (line
    10) while rank 0 runs its last step (line 8)."""
    code = code_of(source, (8, 10))
    history = _steps(3, 8, 8)
    loaders = [
        None if e is None else [dict({"loader": 0, "epochs": e[0], "steps": list(e[1])}, **e[2])] for e in epochs
    ]
    main = ("main.py", 30, "main")
    return Trace(
        states(
            departed_state(0, 2, history, forward_sync(6, 8), [main, ("train.py", 8, "train")], code, loaders[0]),
            departed_state(
                1,
                2,
                history,
                barrier(6, ("train.py", 10, "train")),
                [main, ("train.py", 10, "train")],
                code,
                loaders[1],
            ),
        ),
        2,
    )


HANDLER_SOURCE = """def train(model, rank):
    for step in range(6):
        loss = model(decode(step, rank)).sum()
        loss.backward()


def save_checkpoint(model):
    names = [None]
    dist.broadcast_object_list(names, src=0)


def main():
    try:
        train(model, rank)
    except Exception:
        log("training failed; saving a checkpoint")
        save_checkpoint(model)
        raise
"""


def trace_handler_collective(source=HANDLER_SOURCE) -> Trace:
    """Rank 1's step raised; main()'s `except Exception:` saves a checkpoint, whose broadcast_object_list rank 0,
    still training inside the try, never joins. Two steps of history: too little for the history rule."""
    code = code_of(source, (4, 9, 14, 17))
    history = [grad_sync(1, 4, age=30.0, state="completed")]
    bcast = rec(
        2,
        "broadcast",
        api="broadcast",
        site=("train.py", 9, "save_checkpoint"),
        region=object_region(("train.py", 9, "save_checkpoint"), "broadcast_object_list"),
    )
    return Trace(
        states(
            departed_state(0, 2, history, grad_sync(2, 4), [("train.py", 14, "main"), ("train.py", 4, "train")], code),
            departed_state(1, 2, history, bcast, [("train.py", 17, "main"), ("train.py", 9, "save_checkpoint")], code),
        ),
        2,
    )


PASSED_BY_SOURCE = """def compute_epoch_metrics(metric, targets):
    if len(targets) == 0:
        return {}
    return {"iou": metric.compute().item()}


def main():
    for epoch in range(2):
        for _ in range(3):
            model(batch()).sum().backward()
        targets = validate(model)
        results = compute_epoch_metrics(metric, targets)
"""


def trace_passed_by(source=PASSED_BY_SOURCE, epochs=(None, None)) -> Trace:
    """Rank 1's validation shard is empty: compute_epoch_metrics() returns before the metric's sync, where rank 0
    waits (line 4, called at 12); rank 1 is back in the next epoch's step (line 10), a move it made before."""
    code = code_of(source, (4, 10, 12))
    history = [grad_sync(s, 10, age=30.0, state="completed", function="main") for s in range(3)]
    loaders = [
        None if e is None else [dict({"loader": 0, "epochs": e[0], "steps": list(e[1])}, **e[2])] for e in epochs
    ]
    sync = rec(3, "barrier", site=("train.py", 4, "compute_epoch_metrics"))
    return Trace(
        states(
            departed_state(
                0,
                2,
                history,
                sync,
                [("train.py", 12, "main"), ("train.py", 4, "compute_epoch_metrics")],
                code,
                loaders[0],
            ),
            departed_state(
                1, 2, history, grad_sync(3, 10, function="main"), [("train.py", 10, "main")], code, loaders[1]
            ),
        ),
        2,
    )


def trace_exited_after_early_stop(source=COUNTED_STOP_SOURCE) -> Trace:
    """Rank 0 broke out of the counted loops on its own validation accuracy and exited the process (nothing after
    the loop); rank 1 waits in its next step's gradient all-reduce."""
    trace = trace_counted_early_stop(source.replace("    dist.barrier()\n", "    log('done')\n"))
    gone = trace.states[0]
    gone.update(status="exited", inflight=[], stacks=[])
    del gone["code"]  # a rank's last state as it exits: no source read (the live ranks have it)
    gone["recent"] = gone["recent"][-8:]
    return trace


def trace_departed_ahead() -> Trace:
    """trace_caught_exception, but rank 1's next forward broadcast (seq 5) completed without rank 0 (on gloo: a
    same-sized call, or an empty tensor): rank 1 waits at seq 6 while rank 0 waits at seq 5."""
    trace = trace_caught_exception()
    ahead = trace.states[1]
    finished = dict(ahead["inflight"][0], state="completed", duration_s=0.001)
    ahead["recent"] = ahead["recent"] + [finished]
    ahead["inflight"] = [forward_sync(6, 4)]
    ahead["last_seq"] = {"0": 6}
    return trace


# ---------------------------------------------------------------- collectives that completed without matching


def signature(
    op="all_reduce", reduce="sum", dtypes=("float32",), counts=(4,), site=DEFAULT_SITE, region=None, root=None
):
    """One fingerprint as watch/fingerprints.py publishes it."""
    return {
        "op": op,
        "reduce": reduce,
        "dtypes": list(dtypes),
        "counts": list(counts),
        "site": as_site(site),
        "region": region,
        "root": root,
    }


def fingerprints(rank, signatures, first=0, group="0", step=12, epoch=2) -> dict:
    """A rank's published positions: `signatures` at seqs first, first + 1, ..."""
    table = {str(i): sig for i, sig in enumerate(signatures)}
    return {
        "v": 1,
        "n": 1,
        "rank": rank,
        "groups": {
            group: {
                "first": first,
                "ids": list(range(len(signatures))),
                "steps": [step] * len(signatures),
                "epoch": epoch,
            }
        },
        "signatures": table,
    }


def trace_completed(per_rank: dict) -> Trace:
    """Running ranks (no collective in flight) carrying their fingerprints: {rank: [signature, ...]}."""
    world = len(per_rank)
    built = {}
    for rank, signatures in per_rank.items():
        state = rank_state(rank, world, recent=[done(len(signatures) - 1, "all_reduce")], idle=0.1)
        state["fingerprints"] = fingerprints(rank, signatures)
        built[rank] = state
    return Trace(built, world)


LOSS, HIST = ("metrics.py", 10, "log_loss"), ("metrics.py", 14, "log_hist")


def trace_float_against_int() -> Trace:
    """Rank 1 all_reduced 4 int32 where rank 0 all_reduced 4 float32 (same bytes: gloo let it through)."""
    return trace_completed(
        {0: [signature(), signature(site=LOSS)], 1: [signature(), signature(dtypes=("int32",), site=LOSS)]}
    )


def trace_crossed_metrics() -> Trace:
    """Rank 0 reduced loss then hist; rank 1 hist then loss: same shapes, values exchanged."""
    return trace_completed(
        {
            0: [signature(), signature(site=LOSS), signature(site=HIST)],
            1: [signature(), signature(site=HIST), signature(site=LOSS)],
        }
    )


def trace_mismatch_crash() -> Trace:
    """Rank 0 aborted by gloo inside all_reduce at log_loss (its fault file); rank 1's all_reduce of 8 failed."""
    survivor = rank_state(
        1,
        2,
        recent=[
            done(2, "all_reduce"),
            rec(
                3, "all_reduce", site=HIST, state="failed", shapes=[[8]], error="RuntimeError: Connection reset by peer"
            ),
        ],
        idle=0.2,
    )
    stack = main_stack(
        ("train.py", 30, "<module>"), LOSS, (PATCH_FILE, 33, "all_reduce", True), (TORCH_FILE, 3252, "all_reduce", True)
    )
    last = rank_state(0, 2, recent=[done(2, "all_reduce")], idle=0.1, stacks=[stack])
    view = {
        "silent_s": 0.0,
        "last_state": last,
        "process": {"exists": False},
        "fault": {"error": "Aborted", "file": "/tmp/ddpwatch-0/faults/job-rank-0.txt"},
    }
    return Trace(states(survivor), 2, {0: view})
