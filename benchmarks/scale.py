"""Many simulated ranks publishing through a real TCPStore: per-rank store traffic, the leader's gather and analysis."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import resource
import time

from . import _common as C

SIZES = {"full": (64, 1024, 16384), "quick": (64, 1024)}
WORKERS = 2  # processes simulating ranks 1..W-1 (this machine has 2 cores); this process is rank 0, the leader
STEADY_TICKS = {"full": 3, "quick": 1}
HANG_TICKS = 2
GRACE, TIMEOUT = 2.0, 300.0
INTERVAL = 1.0  # ddpwatch's default interval (config.py): the rate the store must take is per interval
TARGET_S = 1.0  # the leader's whole verdict: gather + analysis
CHUNK = 512  # keys per multi_get in the comparison column
LOOP = 20  # healthy training iterations recorded before the hang: 3 collectives each


# ---------------------------------------------------------------- what every simulated rank does


class CountingStore:
    """A store client that counts calls and the bytes it sends, so traffic is measured, not assumed."""

    def __init__(self, store):
        self._store = store
        self.calls: dict = {}
        self.sent = 0

    def _count(self, name: str):
        self.calls[name] = self.calls.get(name, 0) + 1

    def set(self, key, value):
        self._count("set")
        self.sent += len(key) + len(value)
        return self._store.set(key, value)

    def add(self, key, amount):
        self._count("add")
        return self._store.add(key, amount)

    def compare_set(self, key, expected, desired):
        self._count("compare_set")  # how a counter is read (without add(key, 0), which a bad value breaks)
        self.sent += len(key) + len(expected) + len(desired)
        return self._store.compare_set(key, expected, desired)

    def check(self, keys):
        self._count("check")
        return self._store.check(keys)

    def get(self, key):
        self._count("get")
        return self._store.get(key)

    def multi_set(self, keys, values):
        self._count("multi_set")
        self.sent += sum(len(k) + len(v) for k, v in zip(keys, values))
        return self._store.multi_set(keys, values)

    def multi_get(self, keys):
        self._count("multi_get")
        return self._store.multi_get(keys)

    def set_timeout(self, timeout):
        return self._store.set_timeout(timeout)

    def clone(self):
        """Another connection to the same server (the node relay's leader reads through one), its calls counted
        with this one's: without it that leader fell back to a read per key, and the count was of the fallback."""
        twin = CountingStore(self._store.clone())
        twin._count = self._count  # type: ignore[method-assign]
        return twin

    def reset(self) -> dict:
        counts, self.calls = dict(self.calls, bytes=self.sent), {}
        self.sent = 0
        return counts


class _Meta:
    """A tensor as the recorder sees it: a shape and a dtype, no data."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape):
        import torch

        self.shape, self.dtype = tuple(shape), torch.float32


def healthy_recorder():
    """A recorder after LOOP training iterations (all_reduce, barrier, broadcast), as the patch layer fills it."""
    from ddpwatch.config import Config
    from ddpwatch.capture.record import Recorder, tensor_meta

    recorder = Recorder(Config().ring_size)
    grads, metric = tensor_meta(_Meta((1024,))), tensor_meta(_Meta((1,)))
    for _ in range(LOOP):
        for op, metas in (("all_reduce", grads), ("barrier", ()), ("broadcast", metric)):
            recorder.finish(recorder.begin(op, op, "0", metas, sys._getframe()))
    return recorder


def block(recorder, leader: bool) -> None:
    """The hang: rank 0 inside DDP.forward's buffer broadcast, every other rank in the next barrier, 10 s ago."""
    from ddpwatch.format import build
    from ddpwatch.capture import record as record_module
    from ddpwatch.capture.record import tensor_meta
    from ddpwatch.capture.sites import frame_site, user_frame

    real = record_module._monotonic
    record_module._monotonic = lambda: real() - 10.0  # as if it had been waiting 10 s: past grace, no waiting for real
    try:
        if leader:
            site = frame_site(user_frame(sys._getframe()))
            with recorder.region((build.DDP_FORWARD, site, "DistributedDataParallel.forward", None)):
                recorder.begin(
                    "broadcast",
                    build.DDP_BUFFER_BROADCAST,
                    "0",
                    tensor_meta([_Meta((16,)), _Meta(())]),
                    sys._getframe(),
                )
        else:
            recorder.begin("barrier", "barrier", "0", (), sys._getframe())
    finally:
        record_module._monotonic = real


def watchdogs(ranks, world_size: int, store, recorder) -> list:
    """One ddpwatch Watchdog per simulated rank (threads never started: this process ticks them in turn)."""
    from ddpwatch.config import Config
    from ddpwatch.watch.watchdog import Watchdog

    config = Config(grace=GRACE, timeout=TIMEOUT, interval=INTERVAL)
    return [Watchdog(recorder, config, rank, world_size, store, "bench") for rank in ranks]


def client(port: int, namespace: str):
    import torch.distributed as dist
    from ddpwatch.watch.store import StateStore

    raw = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=60))
    counting = CountingStore(raw)
    return counting, StateStore(counting, namespace, timeout_s=60.0)


# ---------------------------------------------------------------- worker: simulates a slice of the ranks


def worker(port: int) -> None:
    """Commands on stdin, one JSON reply per line on stdout; ends on 'quit' or end of input."""
    dogs, recorder, counting, store = [], None, None, None
    for line in sys.stdin:
        command = line.split()
        start = time.perf_counter()
        if command[0] == "setup":
            namespace, world_size, low, high = command[1], int(command[2]), int(command[3]), int(command[4])
            counting, store = client(port, namespace)
            recorder = healthy_recorder()
            dogs = watchdogs(range(low, high), world_size, store, recorder)
        elif command[0] == "tick":
            for dog in dogs:
                dog.tick()
        elif command[0] == "block":
            block(recorder, leader=False)
        elif command[0] == "contribute":
            for dog in dogs:
                dog.answers.own(int(command[1]))  # the answer to an incident: full state with stacks
        elif command[0] == "quit":
            return
        reply = {"s": time.perf_counter() - start, "ranks": len(dogs)}
        if counting is not None:
            reply["counts"] = counting.reset()
        print(json.dumps(reply), flush=True)


class Workers:
    """The worker processes, each in its own session so that a failure kills them whole."""

    def __init__(self, port: int, count: int):
        command = [sys.executable, "-m", "benchmarks.scale", "--worker", str(port)]
        self.procs = [
            subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=C.child_env(),
                cwd=C.ROOT,
                start_new_session=True,
            )
            for _ in range(count)
        ]

    def ask(self, commands: list, timeout: float = 300.0) -> list:
        """Send one command to each worker (all at once, so they run in parallel), then read every reply."""
        for proc, command in zip(self.procs, commands):
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        deadline = time.monotonic() + timeout
        replies = []
        for proc in self.procs:
            line = _readline(proc, deadline)
            if not line:
                raise RuntimeError(f"a scale worker stopped (exit {proc.poll()}) after {commands}")
            replies.append(json.loads(line))
        return replies

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write("quit\n")
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            C._killpg(proc.pid)
            if proc.poll() is None:
                proc.wait()


def _readline(proc, deadline: float) -> str:
    """One line from a worker, or '' if it does not answer before the deadline (then it is killed)."""
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(max(0.0, deadline - time.monotonic())):
            C._killpg(proc.pid)
            return ""
    return proc.stdout.readline()


# ---------------------------------------------------------------- the leader (this process, rank 0)


def leader_pass(job, what: str, number: int = 0) -> dict:
    """What rank 0's watchdog does on a hang: gather, assess, group positions, render; each timed.

    what: "positions" (what the watchdog reads every interval), "states" (the heartbeats it read before positions
    existed) or "incident" (every rank's answer to incident `number`, with stacks).
    """
    from ddpwatch import analysis
    from ddpwatch.render.text import render_text
    from ddpwatch.render.positions import groups_by_position

    store, world_size = job.store, job.world_size
    keys = {
        "positions": [store.key("pos", r) for r in range(world_size)],
        "states": [store.key("state", r) for r in range(world_size)],
        "incident": [store.key("incident", number, "rank", r) for r in range(world_size)],
    }[what]
    gather = {"positions": job.positions, "states": job.states, "incident": lambda: job.collect(number, deadline=0.0)}[
        what
    ]  # every answer is in: no waiting
    times, before = {}, rss_mib()
    start = time.perf_counter()
    states = gather()
    times["gather"] = time.perf_counter() - start
    start = time.perf_counter()
    assessment = analysis.assess(states, world_size, GRACE, TIMEOUT)
    times["assess"] = time.perf_counter() - start
    start = time.perf_counter()
    groups_by_position(states, GRACE)
    times["positions"] = time.perf_counter() - start
    incident = {
        "format_version": 1,
        "run_id": "bench",
        "world_size": world_size,
        "created_at": time.time(),
        "trigger": assessment.verdict,
        "written_by": 0,
        "grace": GRACE,
        "timeout": TIMEOUT,
        "ranks": [states[r] for r in sorted(states)],
        "missing_ranks": [r for r in range(world_size) if r not in states],
        "findings": assessment.findings,
    }
    start = time.perf_counter()
    text = render_text(incident)
    times["render"] = time.perf_counter() - start
    # Measured while the gathered states are still alive: what holding them costs the leader.
    held = rss_mib() - before
    start = time.perf_counter()
    raw = store._store.multi_get(keys)  # the same bytes again, without decoding: how much of gather is transfer
    times["transfer"] = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(0, len(keys), CHUNK):  # the same keys in slices: TCPStore's multi_get grows faster than linearly
        store._store.multi_get(keys[i : i + CHUNK])
    times["chunked"] = time.perf_counter() - start
    return {
        "times": times,
        "held_mib": held,
        "peak_rss_mib": peak_rss_mib(),
        "states": len(states),
        "mib": sum(len(v) for v in raw) / 2**20,
        "verdict": assessment.verdict,
        "kinds": [f["kind"] for f in assessment.findings],
        "lines": text.count("\n"),
        "text_bytes": len(text.encode()),
        "text": text,
    }


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def simulate(world_size: int, mode: str, server_port: int, workers: Workers) -> dict:
    """One world size, start to verdict; returns the measurements."""
    namespace = f"bench-{world_size}-{os.getpid()}"
    counting, store = client(server_port, namespace)
    leader_recorder = healthy_recorder()
    [leader] = watchdogs([0], world_size, store, leader_recorder)
    bounds = [1 + (world_size - 1) * i // WORKERS for i in range(WORKERS + 1)]
    workers.ask([f"setup {namespace} {world_size} {bounds[i]} {bounds[i + 1]}" for i in range(WORKERS)])
    out = {"ranks": world_size, "steady": [], "hang": []}
    for _ in range(STEADY_TICKS[mode]):
        out["steady"].append(one_interval(workers, leader, counting))
    block(leader_recorder, leader=True)
    workers.ask(["block"] * WORKERS)
    for _ in range(HANG_TICKS):
        out["hang"].append(one_interval(workers, leader, counting, leader_ticks=False))
    out["waiting"] = leader.job.waiting()
    out["positions"] = leader_pass(leader.job, "positions")
    out["light"] = leader_pass(leader.job, "states")
    number = leader.job.open_incident({"trigger": "deadlock", "leader": 0, "action": "report"})
    start = time.perf_counter()
    leader.answers.own(number)
    replies = workers.ask([f"contribute {number}"] * WORKERS)
    out["contribute_s"] = time.perf_counter() - start
    out["contribute_bytes"] = sum(r["counts"]["bytes"] for r in replies) / max(1, world_size - 1)
    out["full"] = leader_pass(leader.job, "incident", number=number)
    return out


def one_interval(workers: Workers, leader, counting, leader_ticks: bool = True) -> dict:
    """Every simulated rank publishes once, as in one watchdog interval; the leader publishes its own state."""
    counting.reset()
    if leader_ticks:
        leader.tick()
    else:
        leader.job.publish(0, leader.state())  # tick() would start an incident; this writes its beat number too
    leader_counts = counting.reset()
    start = time.perf_counter()
    replies = workers.ask(["tick"] * WORKERS)
    wall = time.perf_counter() - start
    calls = {}
    for reply in replies:
        for name, count in reply["counts"].items():
            calls[name] = calls.get(name, 0) + count
    simulated = sum(r["ranks"] for r in replies)
    ops = sum(v for k, v in calls.items() if k != "bytes")
    return {
        "wall": wall,
        "ops_per_rank": ops / simulated,
        "bytes_per_rank": calls.get("bytes", 0) / simulated,
        "ops_per_s": ops / wall,
        "calls": calls,
        "leader": leader_counts,
    }


# ---------------------------------------------------------------- output


def traffic_rows(results: list) -> list:
    rows = []
    for r in results:
        steady, hang = r["steady"][-1], r["hang"][-1]
        first_hang = r["hang"][0]
        rows.append(
            [
                r["ranks"],
                f"{steady['ops_per_rank']:.2f}",
                f"{first_hang['ops_per_rank']:.2f} then {hang['ops_per_rank']:.2f}",
                f"{steady['bytes_per_rank'] / 1024:.1f}",
                f"{hang['bytes_per_rank'] / 1024:.1f}",
                f"{r['contribute_bytes'] / 1024:.1f}",
                f"{max(i['wall'] for i in r['steady']):.3f}",
                f"{steady['ops_per_s']:.0f}",
                f"{r['ranks'] * steady['ops_per_rank'] / INTERVAL:.0f}",
            ]
        )
    return rows


def leader_rows(results: list) -> list:
    rows = []
    for r in results:
        for name, key in (
            ("positions (what the leader reads each interval)", "positions"),
            ("heartbeat states", "light"),
            ("incident states (stacks)", "full"),
        ):
            p = r[key]
            t = p["times"]
            analysis_s = t["assess"] + t["positions"] + t["render"]
            total = t["gather"] + analysis_s
            rows.append(
                [
                    r["ranks"],
                    name,
                    p["states"],
                    f"{p['mib']:.1f}",
                    f"{t['gather']:.3f}",
                    f"{t['transfer']:.3f}",
                    f"{t['chunked']:.3f}",
                    f"{t['assess']:.3f}",
                    f"{t['positions']:.3f}",
                    f"{t['render']:.3f}",
                    f"{analysis_s:.3f}",
                    f"{total:.3f}" + (" (< 1 s)" if total < TARGET_S else " (>= 1 s)"),
                    f"{p['held_mib']:.0f}",
                    f"{p['peak_rss_mib']:.0f}",
                    p["lines"],
                    ", ".join(p["kinds"]) or p["verdict"] or "none",
                ]
            )
        rows.append(
            [
                r["ranks"],
                "contributions to the incident, all ranks",
                "-",
                "-",
                f"{r['contribute_s']:.3f}",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
            ]
        )
    return rows


def main(argv=None) -> None:
    args = C.parser(__doc__)
    args.add_argument("--worker", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args.add_argument("--show-report", type=int, metavar="RANKS", help="print the text report for this size")
    opts = args.parse_args(argv)
    if opts.worker:
        worker(opts.worker)
        return
    import torch.distributed as dist

    mode = "quick" if opts.quick else "full"
    C.header("scale: many simulated ranks on one TCPStore", opts.quick)
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    print(
        f"TCPStore server in this process (libuv: {server.libuvBackend}); ranks 1..W-1 simulated by {WORKERS} "
        f"processes with one store client each; rank 0 (the leader) is this process; interval {INTERVAL} s"
    )
    workers = Workers(server.port, WORKERS)
    results = []
    try:
        for world_size in SIZES[mode]:
            results.append(simulate(world_size, mode, server.port, workers))
    finally:
        workers.close()
    C.print_table(
        "Store traffic per simulated rank (measured by counting the calls ddpwatch's Watchdog makes)",
        [
            "ranks",
            "ops/rank/interval, healthy",
            "ops/rank/interval, hang (first, then)",
            "KiB sent/rank/interval, healthy",
            "KiB, hang",
            "KiB per incident answer",
            "one interval of all ranks here (s)",
            "store ops/s achieved",
            "ops/s the server must take",
        ],
        traffic_rows(results),
    )
    C.print_table(
        "The leader (rank 0): gather every state, then analysis.assess + render positions + "
        "render_text; memory: RSS growth while the states are held, and the process's peak RSS so far",
        [
            "ranks",
            "what",
            "states",
            "MiB in the store",
            "gather (s)",
            "of which multi_get (s)",
            f"multi_get in slices of {CHUNK} (s)",
            "assess (s)",
            "positions (s)",
            "render_text (s)",
            "analysis (s)",
            "total (s)",
            "RSS growth (MiB)",
            "peak RSS (MiB)",
            "report lines",
            "finding",
        ],
        leader_rows(results),
    )
    for r in results:
        if opts.show_report == r["ranks"]:
            print(r["full"]["text"])


if __name__ == "__main__":
    main()
