"""Per-collective overhead of the guard: the wrapper alone (torch's fake process group) and 2 gloo ranks, A/B/B/A."""

from __future__ import annotations

import argparse
import collections
import itertools
import logging
import os
import sys
import threading
import time
import types

from . import _common as C

FAKE = {"full": (20000, 10), "quick": (1000, 2)}  # (iterations per block, A/B/B/A rounds)
# The guard() wall-clock target, watchdog thread included: blocks long enough to hold its rounds (one per interval).
GUARD_WALL = {"full": (3.0, 6), "quick": (0.2, 1)}  # (seconds per block, A/B/B/A rounds): ~3 rounds per block
GLOO = {"full": (200, 10), "quick": (30, 1)}
TARGET_US = 2.0  # issue 14: at most 2 us added per collective on the fake process group
TARGET_RATIO = 1.01
TARGET_GLOO_THREAD_US = 3.0  # issue 19: calling-thread CPU added per real gloo collective
COLD_SLEEP_S = 0.0003  # the pause before each call in the "cold" fake-pg row, about one small gloo op
INTERLEAVED = {"full": 20000, "quick": 300}  # op-by-op pairs per collective, 2 gloo ranks (or --ranks)
INTERLEAVED_BURN_US = 2.0  # the interleaved control: a pass-through that burns this much wall time before the op
CONTROL_US = 8.0  # about what the guard's hot path costs per op (the fake-pg table): the control burns as much
# wall: what the loop waits; thread: CPU of the calling thread only (the wrapper's own work, and other processes
# on a shared machine cannot inflate it); process: CPU of every thread (gloo's and the watchdog's too).
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time, "process": time.process_time}


class _Warnings(logging.Handler):
    """Keeps what ddpwatch logs, so the table can say whether the watchdog armed and why not."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({type(record.exc_info[1]).__name__}: {str(record.exc_info[1]).splitlines()[0]})"
        self.messages.append(text)


def make_ops(world_size: int, dist=None) -> dict:
    """The small collectives of a tight loop; 1 MiB is 262,144 float32. `dist`: where the collectives are looked up
    on each call (torch.distributed by default)."""
    import torch

    if dist is None:
        import torch.distributed as dist

    one, big = torch.ones(1), torch.ones(262144)
    gathered = [torch.empty(1) for _ in range(world_size)]
    return {
        "all_reduce 1 elem": lambda: dist.all_reduce(one),
        "all_reduce 1 MiB": lambda: dist.all_reduce(big),
        "barrier": lambda: dist.barrier(),
        "broadcast 1 elem": lambda: dist.broadcast(one, 0),
        "all_gather 1 elem": lambda: dist.all_gather(gathered, one),
    }


def timed_block(fn, iterations: int) -> dict:
    """Microseconds per call over one block, on every clock."""
    start = {name: clock() for name, clock in CLOCKS.items()}
    for _ in range(iterations):
        fn()
    return {name: (clock() - start[name]) / iterations * 1e6 for name, clock in CLOCKS.items()}


class Guard:
    """The B side: ddpwatch.install() before a block, uninstall() after."""

    def on(self):
        import ddpwatch

        return ddpwatch.install()

    def off(self) -> None:
        import ddpwatch

        ddpwatch.uninstall()


class Burner:
    """The control B side: a pass-through wrapper on dist.all_reduce that only burns `us` of CPU per call.

    On a loaded machine a few microseconds of extra CPU per op can cost far more wall time on gloo (the op's
    threads miss their window and sleep); this shows how much of the guard's gloo figure is that effect.
    """

    def __init__(self, us: float):
        self.seconds = us * 1e-6
        self.original = None

    def on(self):
        import torch.distributed as dist

        original, seconds = dist.all_reduce, self.seconds

        def burning(*args, **kwargs):
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
            return original(*args, **kwargs)

        self.original, dist.all_reduce = original, burning
        return None

    def off(self) -> None:
        import torch.distributed as dist

        dist.all_reduce = self.original


def measure(ops: dict, iterations: int, rounds: int, sync, side=None) -> dict:
    """A/B/B/A rounds in one process; the B side (the guard by default) is switched on and off between blocks."""
    side = side or Guard()
    blocks = {name: {False: [], True: []} for name in ops}
    facts = {"watchdog_armed": [], "left_in_flight": 0, "recorders": []}
    for fn in ops.values():
        timed_block(fn, max(1, iterations // 10))  # warm-up: first-call costs belong to neither side
    for flag in C.abba(rounds):
        session = side.on() if flag else None
        if session is not None:
            facts["watchdog_armed"].append(session.watchdog is not None)
            facts["recorders"].append(session.recorder.kind)  # the one in use: flight falls back where it cannot serve
        for name, fn in ops.items():
            sync()
            blocks[name][flag].append(timed_block(fn, iterations))
            if session is not None:
                # The fake pg's Work never says completed, so its records stay "in flight"; a real backend's do not.
                facts["left_in_flight"] = max(facts["left_in_flight"], len(session.recorder.inflight))
                for record in list(session.recorder.inflight):
                    session.recorder.finish(record)
        if flag:
            side.off()
    facts["times"] = {
        clock: {
            name: {"off": [b[clock] for b in per[False]], "on": [b[clock] for b in per[True]]}
            for name, per in blocks.items()
        }
        for clock in CLOCKS
    }
    return facts


def fake_worker(iterations: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import FakeWork
    from torch.testing._internal.distributed.fake_pg import FakeStore  # private: benchmarks only

    torch.set_num_threads(1)
    caught = _Warnings()
    logging.getLogger("ddpwatch").addHandler(caught)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    ops = make_ops(4)
    # As shipped, FakeWork.is_completed() stays False after wait(), so every record would stay "in flight" (a
    # real backend's Work completes): measure that case once on its own, then make the fake Work behave.
    never = measure({"all_reduce 1 elem": ops["all_reduce 1 elem"]}, iterations, rounds, lambda: None)
    original = FakeWork.is_completed
    FakeWork.is_completed = lambda self: True
    try:
        facts = measure(ops, iterations, rounds, lambda: None)
        facts["parts"] = hot_path_parts(iterations)
        # A real collective blocks, and the thread comes back to cold caches: sleep between calls to see that.
        one = ops["all_reduce 1 elem"]
        facts["cold"] = measure(
            {"all_reduce 1 elem": lambda: (time.sleep(COLD_SLEEP_S), one())},
            max(1, iterations // 10),
            rounds,
            lambda: None,
        )
    finally:
        FakeWork.is_completed = original
    dist.destroy_process_group()
    facts["never_completes"] = never
    facts["warnings"] = sorted(set(caught.messages))
    C.emit(facts)


def hot_path_parts(iterations: int) -> dict:
    """The wrapper's steps timed one by one (with the guard on), to show where the added microseconds go."""
    import torch

    import torch.utils.data

    import ddpwatch
    from ddpwatch.capture import loaders, record

    session = ddpwatch.install()
    recorder, patcher, tensor = session.recorder, session.patcher, torch.ones(1)
    _, mark_busy, unmark_busy, _, _ = recorder.hot_path_parts()
    meta = record.tensor_meta(tensor)
    here = sys._getframe()
    epochs, loader = loaders.Epochs(lambda: 0), torch.utils.data.DataLoader(range(8), batch_size=2)
    parts = {
        "tensor_meta(tensor)": lambda: record.tensor_meta(tensor),
        "Patcher.group_name(None)": lambda: patcher.group_name(None),
        "busy-thread set: add + discard": lambda: (mark_busy(1), unmark_busy(1)),
        "sys._getframe() of a new frame (the caller's, on the hot path)": lambda: sys._getframe(),
        "Recorder.begin + finish_returned": lambda: recorder.finish_returned(
            recorder.begin("all_reduce", "all_reduce", "0", meta, here)
        ),
        "Epochs.began(a DataLoader): once per epoch, never per op": lambda: epochs.began(loader),
    }
    try:
        return {name: min(timed_block(fn, iterations)["thread"] for _ in range(3)) for name, fn in parts.items()}
    finally:
        ddpwatch.uninstall()


def guard_wall_worker(seconds: float, rounds: int) -> None:
    """`with guard():` around blocks of all_reduce on the fake pg, with a store the watchdog can use (HashStore):
    the wall clock then includes the watchdog thread's rounds and the GIL they take."""
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers the "fake" backend
    from torch._C._distributed_c10d import FakeWork

    import ddpwatch

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=4)
    FakeWork.is_completed = lambda self: True  # as a real backend's Work after wait() (see fake_worker)
    one = torch.ones(1)
    op = lambda: dist.all_reduce(one)
    start = time.perf_counter()
    timed_block(op, 2000)
    iterations = max(1000, int(seconds / ((time.perf_counter() - start) / 2000)))
    blocks, armed, watchdog_cpu, watchdog_wall = {False: [], True: []}, [], 0.0, 0.0
    for flag in C.abba(rounds):
        if not flag:
            blocks[flag].append(timed_block(op, iterations))
            continue
        with ddpwatch.guard() as session:
            watchdog = session.watchdog
            armed.append(watchdog is not None)
            cpu = C.thread_cpu(watchdog)
            blocks[flag].append(timed_block(op, iterations))
            watchdog_cpu += C.thread_cpu(watchdog) - cpu
            watchdog_wall += blocks[flag][-1]["wall"] * iterations / 1e6
    dist.destroy_process_group()
    C.emit(
        {
            "iterations": iterations,
            "armed": all(armed),
            "watchdog_us_per_s": watchdog_cpu / watchdog_wall * 1e6,
            "times": {
                clock: {
                    "all_reduce 1 elem": {
                        "off": [b[clock] for b in blocks[False]],
                        "on": [b[clock] for b in blocks[True]],
                    }
                }
                for clock in CLOCKS
            },
        }
    )


def run_worker(kind: str, first, second, timeout: float) -> dict:
    """One single-process worker of this benchmark, bounded; its results, or the benchmark fails saying why."""
    rc, out, err = C.run_bounded(
        [sys.executable, "-m", "benchmarks.overhead_ops", "--worker", kind, str(first), str(second)], timeout=timeout
    )
    results = C.parse_results(out)
    if rc != 0 or not results:
        raise SystemExit(f"{kind} worker failed (exit {rc}):\n{err[-3000:]}")
    return results[0]


def run_guard_wall(mode: str) -> None:
    seconds, rounds = GUARD_WALL[mode]
    facts = run_worker("guard-wall", seconds, rounds, timeout=600)
    rows = []
    for clock in CLOCKS:
        s = summarize([facts], clock)["all_reduce 1 elem"]
        rows.append([clock, s["off"], s["on"], s["added"], spread(s), s["best_added"], f"{s['ratio']:.3f}"])
    C.print_table(
        f"`with guard():` around blocks of all_reduce 1 elem on the fake pg (HashStore, so the watchdog "
        f"runs: armed {'yes' if facts['armed'] else 'NO'}), {facts['iterations']} calls per block "
        f"(~{seconds:g} s), {rounds} A/B/B/A rounds, medians of per-round means",
        [
            "clock",
            "without guard (us)",
            "with guard (us)",
            "added (us)",
            "added, min .. max over rounds",
            "added, fastest blocks (us)",
            "ratio",
        ],
        rows,
    )
    wall = summarize([facts], "wall")["all_reduce 1 elem"]
    print(
        f"target: wall clock with guard() on the fake pg, watchdog thread included, <= {TARGET_US:g} us per op: "
        f"{wall['added']:.2f} us ({'met' if wall['added'] <= TARGET_US else 'NOT met'}); the watchdog thread used "
        f"{facts['watchdog_us_per_s']:.0f} us of CPU per second\n"
    )


def gloo_worker(iterations: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    caught = _Warnings()
    logging.getLogger("ddpwatch").addHandler(caught)
    dist.init_process_group("gloo")
    ops = make_ops(dist.get_world_size())
    facts = measure(ops, iterations, rounds, dist.barrier)
    control = {"all_reduce 1 elem": ops["all_reduce 1 elem"]}
    facts["control"] = measure(control, iterations, rounds, dist.barrier, Burner(CONTROL_US))
    dist.barrier()
    dist.destroy_process_group()
    facts["rank"] = int(os.environ["RANK"])
    facts["warnings"] = sorted(set(caught.messages))
    C.emit(facts)


SIDES = ("on", "control", "pass", "least")  # what the op-by-op table adds to the unguarded call, beside the guard


def least_record(fn, tensor):
    """The floor of any Python recorder: the original called through one Python frame that keeps a record of nine
    fields as a list (sequence number, group, op, the tensor's shape and dtype, thread, the caller's code and
    instruction, start, end), appends it to a bounded ring and holds it in an in-flight dict while the call runs.
    No nesting guard, no group lookup, no regions, no site counts, no error handling: what ddpwatch's wrapper does
    and this leaves out is what the guard's cost above this floor pays for."""
    ring, inflight, seqs = collections.deque(maxlen=2048), {}, {}
    get_ident, mono, getframe = threading.get_ident, time.monotonic, sys._getframe

    def least():
        seq = seqs.get("0", 0)
        seqs["0"] = seq + 1
        caller = getframe(1)
        shape = ((tensor.shape, tensor.dtype),)
        record = [seq, "0", "op", shape, get_ident(), id(caller.f_code), caller.f_lasti, mono(), None]
        ring.append(record)
        inflight[record[4]] = record
        fn()
        record[8] = mono()
        inflight.pop(record[4], None)

    return least


def interleaved(ops_off: dict, ops_on: dict, pairs: int, burn_us: float, tensor) -> dict:
    """Per op: the calling thread's CPU for the original call, the guarded call, and three pass-throughs around the
    original (a control that burns `burn_us`, a bare Python frame, the least a Python recorder keeps: least_record),
    op by op in rotating order, with the guard installed throughout (the watchdog thread runs for all alike: its own
    cost is the attribution benchmark's GIL figure).

    Blocks of a few hundred real collectives swing by 10-20 us per op between blocks on this machine (the block
    table's min .. max); measured op by op the sides share every drift, and a mean over thousands of ops has a
    standard error of a fraction of a microsecond."""
    clock, orders = time.thread_time_ns, list(itertools.permutations(("off",) + SIDES))
    burn_s = burn_us * 1e-6

    def control(fn):
        def burning():
            end = time.perf_counter() + burn_s
            while time.perf_counter() < end:
                pass
            fn()

        return burning

    def passing(fn):
        def through():
            return fn()

        return through

    out = {}
    for name in ops_off:
        original = ops_off[name]
        sides = {
            "off": original,
            "on": ops_on[name],
            "control": control(original),
            "pass": passing(original),
            "least": least_record(original, tensor),
        }
        samples: dict = {side: [] for side in sides}
        for i in range(pairs):
            for side in orders[i % len(orders)]:
                start = clock()
                sides[side]()
                samples[side].append(clock() - start)
        out[name] = {side: _mean_added(samples[side], samples["off"]) for side in SIDES}
        out[name]["off"] = sum(samples["off"]) / pairs / 1e3
    return out


def _mean_added(side: list, off: list) -> dict:
    """Mean added us per op, with its standard error, from paired samples (ns)."""
    diffs = [a - b for a, b in zip(side, off)]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
    return {"added": mean / 1e3, "stderr": (var / len(diffs)) ** 0.5 / 1e3}


def interleaved_worker(pairs: int, _unused: int) -> None:
    """A gloo rank of 2 (or of --ranks): the guard installed, the originals called beside the wrappers (see
    `interleaved`)."""
    import torch
    import torch.distributed as dist

    import ddpwatch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # The unguarded side calls torch's own functions, kept aside before install(); the guarded side the patched ones.
    originals = types.SimpleNamespace(**{name: getattr(dist, name) for name in dir(dist) if not name.startswith("__")})
    session = ddpwatch.install()
    ops_off, ops_on = make_ops(dist.get_world_size(), originals), make_ops(dist.get_world_size())
    for fn in list(ops_off.values()) + list(ops_on.values()):
        for _ in range(max(10, pairs // 20)):
            fn()  # warm-up
    progress = session.recorder.progress
    for fn in ops_off.values():
        fn()
    if session.recorder.progress != progress:
        raise SystemExit("the unguarded side recorded a collective: it is not unguarded")
    dist.barrier()
    result = interleaved(ops_off, ops_on, pairs, INTERLEAVED_BURN_US, torch.ones(1))
    armed = session.watchdog is not None
    ddpwatch.uninstall()
    dist.barrier()
    dist.destroy_process_group()
    C.emit({"rank": int(os.environ["RANK"]), "pairs": pairs, "armed": armed, "ops": result})


def summarize(per_rank: list, clock: str) -> dict:
    """Per op: the A/B/B/A statistics of the per-block times averaged over ranks; plus the whole loop."""
    names = list(per_rank[0]["times"][clock])
    mean = lambda lists: [sum(vals) / len(vals) for vals in zip(*lists)]
    blocks = {n: {side: mean([r["times"][clock][n][side] for r in per_rank]) for side in ("off", "on")} for n in names}
    stats = {n: C.paired(blocks[n]["off"], blocks[n]["on"]) for n in names}
    if len(names) > 1:
        loop = {side: [sum(vals) for vals in zip(*(blocks[n][side] for n in names))] for side in ("off", "on")}
        stats[f"loop of all {len(names)} (sum)"] = C.paired(loop["off"], loop["on"])
    return stats


def _verdict(added_us: float) -> str:
    return "yes" if added_us <= TARGET_US else "NO"


def spread(s: dict) -> str:
    return f"{s['added_min']:.1f} .. {s['added_max']:.1f}"


def run_fake(mode: str) -> None:
    iterations, rounds = FAKE[mode]
    facts = run_worker("fake", iterations, rounds, timeout=300)
    stats = summarize([facts], "thread")
    single_ops = set(stats) - {name for name in stats if name.startswith("loop")}  # the target is per collective
    cold = summarize([facts["cold"]], "thread")["all_reduce 1 elem"]
    stats[f"all_reduce 1 elem, after a {COLD_SLEEP_S * 1e3:g} ms sleep (cold caches)"] = cold
    C.print_table(
        f"Hot path alone: torch's fake process group (world_size 4, one process), CPU time of the calling "
        f"thread, {iterations} calls per block, {rounds} A/B/B/A rounds, medians of per-round means",
        [
            "op",
            "without guard (us)",
            "with guard (us)",
            "added (us)",
            "added, min .. max over rounds",
            "added, fastest blocks (us)",
            "ratio",
            f"<= {TARGET_US:g} us (median / fastest)",
        ],
        [
            [
                name,
                s["off"],
                s["on"],
                s["added"],
                spread(s),
                s["best_added"],
                f"{s['ratio']:.3f}",
                f"{_verdict(s['added'])} / {_verdict(s['best_added'])}" if name in single_ops else "-",
            ]
            for name, s in stats.items()
        ],
    )
    C.print_table(
        "Where the hot path's time goes (guard on, fake pg; thread CPU time, best of 3 blocks)",
        ["step", "us per call"],
        [[name, us] for name, us in facts["parts"].items()],
    )
    never = summarize([facts["never_completes"]], "thread")["all_reduce 1 elem"]
    print(
        f"FakeWork.is_completed() was made to return True above, as a real backend's Work does after wait();"
        f" as shipped it stays False, every record stays in flight (up to "
        f"{facts['never_completes']['left_in_flight']} per block, cleared between blocks by the benchmark) and "
        f"all_reduce 1 elem then costs {never['off']:.1f} -> {never['on']:.1f} us (+{never['added']:.1f} us)."
    )
    print(
        f"watchdog armed under the fake pg (FakeStore): {'yes' if all(facts['watchdog_armed']) else 'no'}"
        + (f"; ddpwatch logged: {'; '.join(facts['warnings'])}" if facts["warnings"] else "")
    )
    print()


def gloo_rows(results: list, key=None, label: str = "") -> list:
    """One row per op: wall-time A/B/B/A statistics, and the CPU the guard added on the calling thread and in all."""
    pick = (lambda r: r[key]) if key else (lambda r: r)
    stats = {clock: summarize([pick(r) for r in results], clock) for clock in CLOCKS}
    rows = []
    for name, wall in stats["wall"].items():
        thread, process = stats["thread"][name], stats["process"][name]
        rows.append(
            [
                label + name,
                wall["off"],
                wall["on"],
                wall["added"],
                spread(wall),
                f"{wall['ratio']:.3f}",
                thread["added"],
                process["added"],
            ]
        )
    return rows


def run_gloo(mode: str) -> None:
    from ddpwatch.launch import run_ranks

    iterations, rounds = GLOO[mode]
    command = [sys.executable, "-m", "benchmarks.overhead_ops", "--worker", "gloo", str(iterations), str(rounds)]
    ranks = run_ranks(command, 2, env=C.child_env(), timeout=600, cwd=C.ROOT)
    results = [doc for r in ranks for doc in C.parse_results(r.stdout)]
    if len(results) != 2:
        raise SystemExit(
            "gloo ranks failed:\n" + "\n".join(f"rank {r.rank} exit {r.returncode}: {r.stderr[-2000:]}" for r in ranks)
        )
    rows = gloo_rows(results) + gloo_rows(results, "control", f"control (burns {CONTROL_US:g} us, no guard): ")
    C.print_table(
        f"2 gloo ranks on this machine, {iterations} calls per block, {rounds} A/B/B/A rounds, averaged "
        f"over both ranks, medians of per-round means; the control row swaps the guard for a pass-through "
        f"wrapper that only burns CPU",
        [
            "op",
            "wall without (us)",
            "wall with (us)",
            "wall added (us)",
            "wall added, min .. max",
            "wall ratio",
            "calling-thread CPU added (us)",
            "process CPU added (us)",
        ],
        rows,
    )
    loop = next(s for name, s in summarize(results, "wall").items() if name.startswith("loop"))
    armed = all(a for r in results for a in r["watchdog_armed"])
    recorders = sorted({kind for r in results for kind in r["recorders"]})
    print(
        f"whole loop: wall ratio {loop['ratio']:.3f} (target < {TARGET_RATIO}); watchdog armed in every guarded "
        f"block: {'yes' if armed else 'no'}; records left in flight: {max(r['left_in_flight'] for r in results)}; "
        f"recorder in the guarded blocks: {', '.join(recorders)}"
    )
    for message in sorted({m for r in results for m in r["warnings"]}):
        print(f"ddpwatch logged: {message}")
    print()


def run_interleaved(mode: str, world: int = 2) -> None:
    from ddpwatch.launch import run_ranks

    pairs = INTERLEAVED[mode]
    command = [sys.executable, "-m", "benchmarks.overhead_ops", "--worker", "interleaved", str(pairs), "0"]
    ranks = run_ranks(command, world, env=C.child_env(), timeout=900, cwd=C.ROOT)
    results = [doc for r in ranks for doc in C.parse_results(r.stdout)]
    if len(results) != world:
        raise SystemExit(
            "gloo ranks failed:\n" + "\n".join(f"rank {r.rank} exit {r.returncode}: {r.stderr[-2000:]}" for r in ranks)
        )
    mean = lambda name, side, key: sum(r["ops"][name][side][key] for r in results) / len(results)
    rows, added = [], {}
    for name in results[0]["ops"]:
        off = sum(r["ops"][name]["off"] for r in results) / len(results)
        added[name] = mean(name, "on", "added")
        cells = [f"{mean(name, side, 'added'):.2f} +- {mean(name, side, 'stderr'):.2f}" for side in SIDES]
        rows.append([name, off, *cells])
    C.print_table(
        f"{world} gloo rank{'s' if world > 1 else ''}, op by op: each op run unguarded, guarded, and through three "
        f"pass-throughs (a control that burns {INTERLEAVED_BURN_US:g} us, a bare Python frame, the least record a "
        f"Python recorder keeps: nine fields, a ring, an in-flight dict) in rotating order, {pairs} times each, "
        f"the guard installed throughout (watchdog armed: {'yes' if all(r['armed'] for r in results) else 'NO'}); "
        f"calling-thread CPU added to the unguarded call, mean of the ranks, +- the standard error",
        [
            "op",
            "unguarded (us)",
            "guard added (us)",
            f"control added (us; burns {INTERLEAVED_BURN_US:g})",
            "bare frame added (us)",
            "least record added (us)",
        ],
        rows,
    )
    least = {name: mean(name, "least", "added") for name in added}
    print(
        f"the floor: the least Python record adds {min(least.values()):.1f} .. {max(least.values()):.1f} us a gloo "
        f"collective on this machine, where {TARGET_GLOO_THREAD_US:g} us is the target"
    )
    worst = max(added, key=added.get)
    print(
        f"target: calling-thread CPU added <= {TARGET_GLOO_THREAD_US:g} us per gloo collective: "
        f"{min(added.values()):.1f} .. {added[worst]:.1f} us ({worst} the most): "
        f"{'met' if added[worst] <= TARGET_GLOO_THREAD_US else 'NOT met'}\n"
    )


def main(argv=None) -> None:
    args = C.parser(__doc__)
    args.add_argument("--worker", nargs=3, metavar=("KIND", "ITERATIONS", "ROUNDS"), help=argparse.SUPPRESS)
    args.add_argument(
        "--ranks",
        nargs="+",
        type=int,
        metavar="N",
        help="the op-by-op gloo table alone, once with each N ranks given (1: gloo's own threads, no peer process)",
    )
    args.add_argument(
        "--recorder",
        choices=("python", "flight"),
        default="python",
        help="the recorder of the guarded side (DDPWATCH_RECORDER; docs/how-it-works.md#the-two-recorders)",
    )
    opts = args.parse_args(argv)
    if opts.worker:
        kind = opts.worker[0]
        if kind == "guard-wall":
            guard_wall_worker(float(opts.worker[1]), int(opts.worker[2]))
            return
        iterations, rounds = int(opts.worker[1]), int(opts.worker[2])
        {"fake": fake_worker, "interleaved": interleaved_worker}.get(kind, gloo_worker)(iterations, rounds)
        return
    mode = "quick" if opts.quick else "full"
    os.environ["DDPWATCH_RECORDER"] = opts.recorder  # the workers inherit it
    C.header(f"overhead_ops: added cost per collective (recorder={opts.recorder})", opts.quick)
    if opts.ranks:
        if min(opts.ranks) < 1 or opts.recorder != "python":
            raise SystemExit("--ranks: one or more rank counts of at least 1, under --recorder python")
        for world in opts.ranks:
            run_interleaved(mode, world)
        return
    if opts.recorder == "flight":
        print(
            "recorder=flight: torch's fake backend records nothing in the Flight Recorder, so the guard falls back "
            "to the python recorder there (its rows: --recorder python); and the op-by-op table needs the wrapped "
            "and unwrapped functions side by side, which flight does not make. The gloo blocks below are its "
            "figure: what is left on the calling thread is the Work.wait hook and the watchdog's polls.\n"
        )
        run_gloo(mode)
        return
    run_fake(mode)
    run_guard_wall(mode)
    run_gloo(mode)
    run_interleaved(mode)


if __name__ == "__main__":
    main()
