"""Where the guard's cost on real collectives comes from: 2 ranks, ddpwatch switched on one part at a time.

Each level adds one part to the one before (monkeypatched here, not user options): the wrapper alone, then the
Work.wait hook (completion tracking), then the watchdog thread building its state with no store I/O, then the Flight
Recorder probe, then the psutil sampler, then the heartbeat publish and the rest of a round: ddpwatch as shipped.
The levels run in one process, in a palindrome order per round (0 1 .. 6 6 .. 1 0), so a drift of the machine hits
every level alike; each level is compared with the unguarded blocks of its own round. The watchdog thread's CPU time
is read from its own CPU clock (pthread_getcpuclockid): the GIL time it takes from training, per second of wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from . import _common as C

LEVELS = (
    "off (no guard)",
    "wrapper only",
    "+ Work.wait hook",
    "+ watchdog thread (state, no store)",
    "+ Flight Recorder probe",
    "+ psutil sampler",
    "+ heartbeat publish (as shipped)",
)
WRAPPER, WAIT, WATCHDOG, PROBE, PSUTIL, PUBLISH = range(1, 7)
SIZES = {"full": (3.0, 3), "quick": (0.15, 1)}  # (seconds per block, rounds): a full block holds ~3 watchdog rounds
# run -> (backend, what one iteration is, its title)
RUNS = {
    "gloo": (
        "gloo",
        "collectives",
        "gloo, 2 ranks: per collective (all_reduce, broadcast, all_gather, barrier of 1 element)",
    ),
    "fakenccl": (
        "fakenccl",
        "collectives",
        "NCCL-like CPU backend (tests/nccl_like.py), 2 ranks: per collective "
        "(the same four; synchronize() per iteration)",
    ),
    "ddp": (
        "gloo",
        "ddp",
        "benign DDP training on gloo, 2 ranks: per step (benchmarks/overhead_training.py's step: "
        "BatchNorm, no_sync accumulation, metric all_reduce)",
    ),
}
TARGET_WATCHDOG_US_PER_S = 500.0  # "a few hundred microseconds per second" of the watchdog thread's CPU
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time, "process": time.process_time}


def make_loop(backend: str, loop: str):
    """(one iteration, collectives per iteration): the small collectives of a tight loop, or a benign DDP step."""
    import torch
    import torch.distributed as dist

    if loop == "ddp":
        from .overhead_training import make_step

        step, counter = make_step(), [0]

        def ddp_iteration():
            counter[0] += 1
            step(counter[0])

        return ddp_iteration, 1

    one = torch.ones(1)
    gathered = [torch.empty(1) for _ in range(dist.get_world_size())]
    ops = (
        lambda: dist.all_reduce(one),
        lambda: dist.broadcast(one, 0),
        lambda: dist.all_gather(gathered, one),
        lambda: dist.barrier(),
    )
    if backend == "fakenccl":
        from tests import nccl_like

        sync = nccl_like.synchronize  # the host read a step of a real NCCL loop ends with (loss.item())
    else:
        sync = lambda: None

    def iteration():
        for op in ops:
            op()
        sync()

    return iteration, len(ops)


class Levels:
    """Switches ddpwatch on up to a level; off() undoes it, and every monkeypatch made for it."""

    def __init__(self):
        self.undo: list = []
        self.session = None

    def _set(self, owner, name: str, value) -> None:
        self.undo.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    def on(self, level: int):
        import ddpwatch
        from ddpwatch.watch import evidence, rank_state, watchdog
        from ddpwatch import session

        if level < WATCHDOG:
            self._set(session.Session, "arm", lambda self: None)
        if level < PROBE:
            self._set(rank_state.StateReader, "_add_unseen_collective", lambda self, doc: None)
        if level < PSUTIL:
            self._set(evidence.ProcessSampler, "facts", lambda self: None)
        if level < PUBLISH:
            self._set(watchdog.Watchdog, "tick", _tick_without_store)
        self.session = ddpwatch.install()
        if level >= WAIT:
            self.session.patcher.hook_work_wait()
        return self.session

    def off(self) -> None:
        import ddpwatch

        ddpwatch.uninstall()
        self.session = None
        while self.undo:
            owner, name, value = self.undo.pop()
            setattr(owner, name, value)


def _tick_without_store(self) -> None:
    """A watchdog round with no store round trip: the completion poll and the state it would publish."""
    self.recorder.poll_pending()
    self.state()


def timed_block(iteration, iterations: int, watchdog) -> dict:
    cpu_start = C.thread_cpu(watchdog) if watchdog is not None else 0.0
    start = {name: clock() for name, clock in CLOCKS.items()}
    for _ in range(iterations):
        iteration()
    times = {name: clock() - start[name] for name, clock in CLOCKS.items()}
    watchdog_cpu = (C.thread_cpu(watchdog) - cpu_start) if watchdog is not None else 0.0
    return dict(times, watchdog=watchdog_cpu)


def agreed_iterations(iteration, seconds: float) -> int:
    """Iterations for a block of about `seconds`, from a timed run without the guard; rank 0's count for all."""
    import torch
    import torch.distributed as dist

    probe = 20
    start = time.perf_counter()
    for _ in range(probe):
        iteration()
    per = (time.perf_counter() - start) / probe
    count = torch.tensor([max(10, int(seconds / max(per, 1e-6)))])
    dist.broadcast(count, 0)
    if dist.get_backend() == "fakenccl":
        from tests import nccl_like

        nccl_like.synchronize()  # its ops finish after they return: read the count once it has arrived
    return int(count.item())


def worker(run: str, seconds: float, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    backend, loop, _ = RUNS[run]
    torch.set_num_threads(1)
    if backend == "fakenccl":
        from tests import nccl_like

        nccl_like.register()
    dist.init_process_group(backend)
    iteration, per_iteration = make_loop(backend, loop)
    iterations = agreed_iterations(iteration, seconds)
    levels = Levels()
    order = list(range(len(LEVELS))) + list(reversed(range(len(LEVELS))))
    blocks: dict = {level: [] for level in range(len(LEVELS))}
    for _ in range(rounds):
        for level in order:
            session = levels.on(level) if level else None
            watchdog = session.watchdog if session is not None else None
            if watchdog is not None and seconds >= session.config.interval:
                time.sleep(1.2 * session.config.interval)  # its first round comes one interval after it starts
            dist.barrier()
            beats = watchdog.states.beat if watchdog is not None else 0
            block = timed_block(iteration, iterations, watchdog)
            block["rounds_ticked"] = (watchdog.states.beat - beats) if watchdog is not None else 0
            block["interval"] = session.config.interval if session is not None else 0.0
            blocks[level].append(block)
            if session is not None:
                levels.off()
    calls = calls_per_iteration(iteration, levels)
    dist.barrier()
    dist.destroy_process_group()
    C.emit(
        {
            "rank": int(os.environ["RANK"]),
            "ops": iterations * per_iteration,
            "calls": calls,
            "per_iteration": per_iteration,
            "blocks": {str(k): v for k, v in blocks.items()},
        }
    )


def calls_per_iteration(iteration, levels, count: int = 10) -> dict:
    """Python and C calls made from ddpwatch's own code per iteration, as shipped: a count no load can move."""
    counts = {"python": 0, "c": 0}

    def profile(frame, event, arg):
        if "ddpwatch" in frame.f_code.co_filename:
            if event == "call":
                counts["python"] += 1
            elif event == "c_call":
                counts["c"] += 1

    levels.on(PUBLISH)
    try:
        iteration()  # first calls (group names, frame kinds) belong to neither
        sys.setprofile(profile)
        try:
            for _ in range(count):
                iteration()
        finally:
            sys.setprofile(None)
    finally:
        levels.off()
    return {kind: n / count for kind, n in counts.items()}


def per_op_us(results: list, level: int, clock: str) -> list:
    """Per block: microseconds per collective on `clock`, averaged over the ranks."""
    return [
        sum(r["blocks"][str(level)][i][clock] / r["ops"] for r in results) / len(results) * 1e6
        for i in range(len(results[0]["blocks"][str(level)]))
    ]


def watchdog_us_per_s(results: list, level: int) -> float:
    """The watchdog thread's CPU time per second, over every block of the level and both ranks: its CPU per round
    (rounds counted by its heartbeats) over one interval. Per second of the block's wall time instead would count a
    round more or less at the block's ends (a block holds only a few)."""
    blocks = [b for r in results for b in r["blocks"][str(level)]]
    cpu, ticked = sum(b["watchdog"] for b in blocks), sum(b["rounds_ticked"] for b in blocks)
    interval = max((b["interval"] for b in blocks), default=0.0)
    return cpu / ticked / interval * 1e6 if ticked and interval else float("nan")  # nan: no round in the blocks


def table(run: str, results: list, seconds: float, rounds: int) -> dict:
    stats: dict = {}
    rows = []
    previous = None
    for level, name in enumerate(LEVELS):
        per_clock = {
            clock: C.paired(per_op_us(results, 0, clock), per_op_us(results, level, clock)) for clock in CLOCKS
        }
        thread = per_clock["thread"]["added"]
        stats[name] = dict(per_clock, watchdog_us_per_s=watchdog_us_per_s(results, level))
        step = None if previous is None else thread - previous
        previous = thread
        rows.append(
            [
                name,
                per_clock["wall"]["on"],
                per_clock["wall"]["added"],
                thread,
                "-" if step is None else f"{step:+.2f}",
                per_clock["process"]["added"],
                stats[name]["watchdog_us_per_s"] if level >= WATCHDOG else "-",
            ]
        )
    C.print_table(
        f"{RUNS[run][2]}; blocks of ~{seconds:g} s ({results[0]['ops']} per block), {rounds} "
        f"palindrome rounds, medians of per-round means against the round's unguarded blocks, averaged "
        f"over both ranks",
        [
            "level (each adds to the one above)",
            "wall per op (us)",
            "wall added (us)",
            "calling-thread CPU added (us)",
            "step from the level above (us)",
            "process CPU added (us)",
            "watchdog thread CPU (us per s)",
        ],
        rows,
    )
    calls = results[0]["calls"]
    unit = "step" if RUNS[run][1] == "ddp" else f"iteration of {results[0]['per_iteration']} collectives"
    print(
        f"as shipped, ddpwatch's own code makes {calls['python']:.1f} Python calls and {calls['c']:.1f} C calls per "
        f"{unit} (rank 0, sys.setprofile, main thread)"
    )
    return stats


def run(name: str, mode: str) -> dict:
    from ddpwatch.launch import run_ranks

    seconds, rounds = SIZES[mode]
    command = [sys.executable, "-m", "benchmarks.attribution", "--worker", name, str(seconds), str(rounds)]
    ranks = run_ranks(command, 2, env=C.child_env(), timeout=900, cwd=C.ROOT)
    results = [doc for r in ranks for doc in C.parse_results(r.stdout)]
    if len(results) != 2:
        raise SystemExit(
            f"{name} ranks failed:\n"
            + "\n".join(f"rank {r.rank} exit {r.returncode}: {r.stderr[-2000:]}" for r in ranks)
        )
    return table(name, results, seconds, rounds)


WRAPPER_PARTS = (
    "off (no guard)",
    "a pass-through Python wrapper",
    "the Patcher, Recorder.begin/finish stubbed",
    "the Patcher (the wrapper only, no watchdog)",
)
WRAPPER_PROBE = {"full": (2000, 8), "quick": (100, 1)}  # (all_reduces per block, palindrome rounds)


def wrapper_parts_worker(calls: int, rounds: int) -> None:
    """One gloo rank (world size 1): the wrapper's own parts on a real, blocking collective, in a palindrome."""
    import torch
    import torch.distributed as dist

    from ddpwatch.launch import free_port
    from ddpwatch.capture.wrappers import Patcher
    from ddpwatch.capture.record import Recorder

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    one, original = torch.ones(1), dist.all_reduce

    def passthrough():
        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            return original(tensor, op, group, async_op)

        dist.all_reduce = all_reduce
        return lambda: setattr(dist, "all_reduce", original)

    def patcher(stubbed: bool):
        recorder = Recorder()
        if stubbed:
            record = recorder.begin("all_reduce", "all_reduce", "0", (), sys._getframe())
            recorder.begin = lambda *args: record
            recorder.finish_returned = lambda record: None
        patched = Patcher(recorder)
        patched.patch()
        return patched.unpatch

    switches = (lambda: lambda: None, passthrough, lambda: patcher(True), lambda: patcher(False))
    blocks: dict = {part: [] for part in range(len(switches))}
    op = lambda: dist.all_reduce(one)
    timed_block(op, calls // 10, None)
    for _ in range(rounds):
        for part in list(range(len(switches))) + list(reversed(range(len(switches)))):
            undo = switches[part]()
            blocks[part].append(timed_block(op, calls, None))
            undo()
    dist.destroy_process_group()
    C.emit({"ops": calls, "blocks": {str(k): v for k, v in blocks.items()}})


def wrapper_parts(mode: str) -> None:
    calls, rounds = WRAPPER_PROBE[mode]
    code, out, err = C.run_bounded(
        [sys.executable, "-m", "benchmarks.attribution", "--worker", "wrapper-parts", str(calls), str(rounds)],
        timeout=600,
    )
    results = C.parse_results(out)
    if code != 0 or not results:
        raise SystemExit(f"wrapper-parts worker failed (exit {code}):\n{err[-3000:]}")
    rows = []
    for part, name in enumerate(WRAPPER_PARTS):
        thread = C.paired(per_op_us(results, 0, "thread"), per_op_us(results, part, "thread"))
        rows.append([name, thread["on"], thread["added"], f"{thread['added_min']:.1f} .. {thread['added_max']:.1f}"])
    C.print_table(
        f"The wrapper's parts on a real collective: one gloo rank (world size 1), all_reduce 1 elem, "
        f"{calls} calls per block, {rounds} palindrome rounds; calling-thread CPU",
        ["what wraps dist.all_reduce", "us per op", "added (us)", "added, min .. max over rounds"],
        rows,
    )


def snapshot_cost(mode: str) -> None:
    """The watchdog's snapshot of this rank, every round: its CPU time with a full ring (best of 5 blocks, hot)."""
    from ddpwatch.capture.record import Recorder

    recorder, here = Recorder(), sys._getframe()
    for _ in range(2 * recorder.ring.maxlen):
        recorder.finish(recorder.begin("all_reduce", "all_reduce", "0", (), here))
    calls = 2000 if mode == "full" else 200
    rows = []
    for recent in (8, 0):
        best = min(
            timed_block(lambda: recorder.snapshot(recent), calls, None)["thread"]  # noqa: B023 (called at once)
            for _ in range(5)
        )
        rows.append(
            [f"Recorder.snapshot(recent={recent}), {len(recorder.ring)} records in the ring", best / calls * 1e6]
        )
    C.print_table(
        "The watchdog round's snapshot (no ranks: a Recorder filled in this process; thread CPU, best of 5 "
        f"blocks of {calls})",
        ["call", "us per call"],
        rows,
    )


def main(argv=None) -> None:
    args = C.parser(__doc__)
    args.add_argument("--worker", nargs=3, metavar=("RUN", "SECONDS", "ROUNDS"), help=argparse.SUPPRESS)
    args.add_argument("--runs", choices=list(RUNS), nargs="+", default=list(RUNS), help="which loops to attribute")
    opts = args.parse_args(argv)
    if opts.worker:
        if opts.worker[0] == "wrapper-parts":
            wrapper_parts_worker(int(opts.worker[1]), int(opts.worker[2]))
        else:
            worker(opts.worker[0], float(opts.worker[1]), int(opts.worker[2]))
        # Its results are out: skip the interpreter's and torch's C++ teardown, which once in a full suite run under
        # load ended a one-rank gloo worker with "terminate called without an active exception" (exit -6) after
        # destroy_process_group, and the benchmark took that for a failed run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    mode = "quick" if opts.quick else "full"
    C.header("attribution: which part of the guard costs what on real collectives", opts.quick)
    shipped = LEVELS[PUBLISH]
    if opts.quick:
        print("(quick mode: blocks shorter than one watchdog round; the figures below are indicative only)")
    snapshot_cost(mode)
    wrapper_parts(mode)
    # The per-op thread-CPU target is judged by overhead_ops (plain A/B/B/A against the guard as shipped): here the
    # as-shipped blocks sit in the middle of each palindrome, farthest in time from the unguarded ones.
    for name in opts.runs:
        stats = run(name, mode)[shipped]
        wd = stats["watchdog_us_per_s"]
        verdict = (
            "no watchdog round fell inside the blocks: blocks too short (quick mode)"
            if wd != wd
            else f"{wd:.0f} us per s ({'met' if wd <= TARGET_WATCHDOG_US_PER_S else 'NOT met'})"
        )
        print(
            f"target: watchdog thread CPU while nothing is wrong <= {TARGET_WATCHDOG_US_PER_S:g} us per s "
            f"({name}): {verdict}\n"
        )


if __name__ == "__main__":
    main()
