"""The job's TCPStore server under ddpwatch's traffic: its operations and CPU per second, and the harm to the job."""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

from . import _common as C
from . import scale

SIZES = {"full": (1024, 4096, 16384), "quick": (64, 256)}
CLIENTS = 2  # processes carrying the simulated ranks (this machine has 2 cores); each has one store connection
INTERVAL = scale.INTERVAL  # the watchdog's default interval: every rank ticks once per interval
HEALTHY_S = {"full": 10.0, "quick": 2.0}  # the healthy phase; the job's harm probe runs inside it
HANG_S = {"full": 5.0, "quick": 2.0}
WARMUP_S = 0.5  # ticking has begun before the job's probe starts timing
PROBES = {"full": 300, "quick": 60}  # set+get round trips per harm measurement (fewer when its time runs out)
PROBE_GAP_S = 0.01  # between probes: a job's own store use is occasional; a tight loop would be load of its own
BARRIER_EVERY = 10  # one store-based barrier per this many probes
PARTICIPANTS = 4  # the barrier's participants: threads of the job process, each with its own store client
TARGET_RANKS, RANKS_PER_NODE = 65536, 8  # the model's prediction
CHILD_LIMIT_S = {"full": 1800, "quick": 120}  # each child ends itself then (SIGALRM), whatever the parent does
REPLY_S = {"full": 600.0, "quick": 60.0}  # longest wait for any one reply from a child


# ---------------------------------------------------------------- the children: server, ranks' clients, the job


def serve() -> None:
    """The store server alone in its process, so that psutil reads its CPU time and nothing else's."""
    import datetime

    import torch.distributed as dist

    limit = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True, timeout=limit)
    print(json.dumps({"port": store.port, "libuv": bool(store.libuvBackend)}), flush=True)
    while True:
        signal.pause()  # the server runs on its own threads; this one only keeps the process alive until killed


def run_ranks(port: int) -> None:
    """Commands on stdin, one JSON reply per line: ready, setup NAMESPACE WORLD LOW HIGH, block, run SECONDS, quit."""
    # Imported before "ready" is answered, so that no import runs during a measurement
    import ddpwatch.watch.watchdog  # noqa: F401
    import torch.distributed  # noqa: F401

    dogs, recorder, counting = [], None, None
    for line in sys.stdin:
        command = line.split()
        reply: dict = {}
        if command[0] == "setup":
            counting, store = scale.client(port, command[1])
            recorder = scale.healthy_recorder()
            dogs = scale.watchdogs(range(int(command[3]), int(command[4])), int(command[2]), store, recorder)
            # The first round publishes whole states: a job's start, not its steady state, so it is not timed.
            reply = untimed_round(dogs, counting)
        elif command[0] == "block":
            # Every rank, rank 0 too, in the same barrier: no verdict before the timeout. The round in which the ranks
            # find themselves blocked (each reads its blocked call's source once) runs unpaced: the hang's onset.
            scale.block(recorder, leader=False)
            reply = untimed_round(dogs, counting)
        elif command[0] == "run":
            reply = paced_rounds(dogs, counting, float(command[1]))
            reply["latest_incident"] = dogs[0].job.counters()[1] if dogs else 0  # after the count: not counted
        elif command[0] == "quit":
            return
        print(json.dumps(reply), flush=True)  # "ready" too: an empty reply, imports done


def untimed_round(dogs: list, counting) -> dict:
    """One round of every rank's tick as fast as it goes: its store operations and how long it took."""
    counting.reset()
    start = time.monotonic()
    for dog in dogs:
        dog.tick()
    calls = counting.reset()
    return {"ranks": len(dogs), "ops": sum(v for k, v in calls.items() if k != "bytes"), "s": time.monotonic() - start}


def paced_rounds(dogs: list, counting, seconds: float) -> dict:
    """Rounds of every rank's tick, spread over each interval as unsynchronised watchdog threads would be, for about
    `seconds`; a round that overruns its interval starts the next at once (then the simulation sets the pace)."""
    counting.reset()
    start = time.monotonic()
    busy, begin = [], start
    while begin < start + seconds:
        spent = 0.0
        for i, dog in enumerate(dogs):
            ahead = begin + INTERVAL * i / len(dogs) - time.monotonic()  # this rank's turn in the interval
            if ahead > 0.001:
                time.sleep(ahead)
            tick_start = time.monotonic()
            dog.tick()
            spent += time.monotonic() - tick_start
        busy.append(spent)
        begin = max(begin + INTERVAL, time.monotonic())
        time.sleep(max(0.0, begin - time.monotonic()))
    calls = {k: v for k, v in counting.reset().items() if k != "bytes"}  # calls only
    return {
        "ranks": len(dogs),
        "rounds": len(busy),
        "busy": busy,
        "ops": sum(calls.values()),
        "calls": calls,
        "start": start,
        "end": time.monotonic(),
    }


def run_job(port: int) -> None:
    """The job's own store use, timed: commands 'measure PROBES SECONDS' and 'quit' on stdin."""
    import datetime
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist

    connect = lambda: dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    mine, participants = connect(), [connect() for _ in range(PARTICIPANTS)]
    rounds = 0
    with ThreadPoolExecutor(PARTICIPANTS) as pool:  # threads made once: a barrier times the store, not thread starts
        for line in sys.stdin:
            command = line.split()
            if command[0] == "quit":
                return
            probes, barriers = [], []
            start = time.monotonic()
            deadline = start + float(command[2])
            while len(probes) < int(command[1]) and time.monotonic() < deadline:
                probes.append(set_get(mine, len(probes)))
                if len(probes) % BARRIER_EVERY == 0:
                    rounds += 1
                    barriers.append(store_barrier(pool, participants, f"job/barrier/{rounds}"))
                time.sleep(PROBE_GAP_S)
            # Its operations load the server too: 2 per probe; add, add, wait per participant, one set per barrier
            ops = 2 * len(probes) + (3 * PARTICIPANTS + 1) * len(barriers)
            done = {"probes": probes, "barriers": barriers, "ops": ops, "start": start, "end": time.monotonic()}
            print(json.dumps(done))
            sys.stdout.flush()


def set_get(store, n: int) -> float:
    """One set and one get of a small value: the round trips a job makes to share an address or a flag."""
    start = time.perf_counter()
    store.set(f"job/probe/{n % 16}", b"x" * 64)
    store.get(f"job/probe/{n % 16}")
    return time.perf_counter() - start


def store_barrier(pool, participants: list, key: str) -> float:
    """torch's _store_based_barrier (distributed_c10d): each participant adds 1, reads the count with add(key, 0),
    the one that sees everyone sets the last-worker key, and all wait for that key. Seconds until the last is out."""

    def arrive(store) -> None:
        store.add(key, 1)
        if store.add(key, 0) == len(participants):
            store.set(f"{key}:last_worker", "1")
        store.wait([f"{key}:last_worker"])

    start = time.perf_counter()
    for done in [pool.submit(arrive, store) for store in participants]:
        done.result()
    return time.perf_counter() - start


# ---------------------------------------------------------------- the parent's side of the children


class Children:
    """`python -m benchmarks.store_load --role ROLE` processes, each in a session of its own (killed as a group)."""

    def __init__(self, role: str, count: int, mode: str, folder: str, port: int = 0):
        command = [sys.executable, "-m", "benchmarks.store_load", "--role", role, "--port", str(port)]
        command += ["--limit", str(CHILD_LIMIT_S[mode])]
        self.role, self.reply_s = role, REPLY_S[mode]
        # cwd: a folder of our own, so that nothing a watchdog might write lands in the repository
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=C.child_env(), cwd=folder)
        self.procs = [subprocess.Popen(command, start_new_session=True, **pipes) for _ in range(count)]

    def send(self, commands: list) -> None:
        for proc, command in zip(self.procs, commands):
            proc.stdin.write(command + "\n")
            proc.stdin.flush()

    def collect(self) -> list:
        deadline = time.monotonic() + self.reply_s
        replies = []
        for proc in self.procs:
            line = scale._readline(proc, deadline)
            if not line:
                raise RuntimeError(f"a {self.role} process stopped or did not answer (exit {proc.poll()})")
            replies.append(json.loads(line))
        return replies

    def ask(self, commands: list) -> list:
        self.send(commands)
        return self.collect()

    def kill(self) -> None:
        for proc in self.procs:
            C._killpg(proc.pid)
            if proc.poll() is None:
                proc.wait()


def cpu_sample(pids: list) -> dict:
    """CPU seconds so far: the processes' total, and per thread (the server's busiest thread is its limit)."""
    total, threads = 0.0, {}
    for pid in pids:
        process = psutil.Process(pid)
        times = process.cpu_times()
        total += times.user + times.system
        threads.update({(pid, t.id): t.user_time + t.system_time for t in process.threads()})
    return {"total": total, "threads": threads, "at": time.monotonic()}


def cpu_rates(before: dict, after: dict) -> tuple:
    """(CPU seconds per second of all the processes, of their busiest thread) between two samples."""
    wall = after["at"] - before["at"]
    busiest = max((after["threads"][t] - before["threads"].get(t, 0.0) for t in after["threads"]), default=0.0)
    return (after["total"] - before["total"]) / wall, busiest / wall


# ---------------------------------------------------------------- phases


def measured_phase(server, clients: Children, seconds: float, job: Children | None = None, probe=None) -> dict:
    """Every client runs its ranks for `seconds`, the job's probe (if any) inside; numbers over the parent's window."""
    server_pid, client_pids = server.pid, [p.pid for p in clients.procs]
    server0, clients0 = cpu_sample([server_pid]), cpu_sample(client_pids)
    clients.send([f"run {seconds}"] * CLIENTS)
    harm = None
    if job is not None:
        time.sleep(WARMUP_S)
        [harm] = job.ask([f"measure {probe[0]} {probe[1]}"])
    replies = clients.collect()
    server1, clients1 = cpu_sample([server_pid]), cpu_sample(client_pids)
    wall = server1["at"] - server0["at"]
    ops = sum(r["ops"] for r in replies)
    rank_rounds = sum(r["ranks"] * r["rounds"] for r in replies)
    server_cpu, busiest = cpu_rates(server0, server1)
    job_ops = harm["ops"] if harm else 0
    return {
        "wall_s": wall,
        "rounds": min(r["rounds"] for r in replies),
        "ops": ops,
        "ops_per_s": ops / wall,
        "job_ops_per_s": job_ops / wall,
        "all_ops_per_s": (ops + job_ops) / wall,
        "ops_per_rank_interval": ops / rank_rounds if rank_rounds else 0.0,
        "calls": {k: sum(r["calls"].get(k, 0) for r in replies) for k in {k for r in replies for k in r["calls"]}},
        "server_cpu_per_s": server_cpu,
        "server_busiest_thread_per_s": busiest,
        "clients_cpu_per_s": cpu_rates(clients0, clients1)[0],
        "slowest_round_s": max(max(r["busy"]) for r in replies if r["busy"]),
        "span": [min(r["start"] for r in replies), max(r["end"] for r in replies)],
        "latest_incident": replies[0]["latest_incident"],
        "harm": summarize_harm(harm) if harm else None,
    }


def baseline_harm(server, job: Children, probe) -> dict:
    """The job's store use with no ddpwatch traffic at all, and what the server spends on it."""
    before = cpu_sample([server.pid])
    [harm] = job.ask([f"measure {probe[0]} {probe[1]}"])
    after = cpu_sample([server.pid])
    server_cpu, busiest = cpu_rates(before, after)
    rate = harm["ops"] / (after["at"] - before["at"])
    return dict(
        summarize_harm(harm), server_cpu_per_s=server_cpu, server_busiest_thread_per_s=busiest, all_ops_per_s=rate
    )


def one_size(ranks: int, mode: str, server, clients: Children, job: Children, probe) -> dict:
    """Setup (not timed), the healthy phase with the job's probe inside it, then the hang."""
    namespace = f"load-{ranks}-{os.getpid()}"
    bounds = [ranks * i // CLIENTS for i in range(CLIENTS + 1)]  # client 0 carries rank 0, the leader
    clients.ask([f"setup {namespace} {ranks} {bounds[i]} {bounds[i + 1]}" for i in range(CLIENTS)])
    healthy = measured_phase(server, clients, HEALTHY_S[mode], job, probe)
    onset = clients.ask(["block"] * CLIENTS)
    hang = measured_phase(server, clients, HANG_S[mode])
    onset_summary = {"ops_per_rank": sum(r["ops"] for r in onset) / ranks, "wall_s": max(r["s"] for r in onset)}
    return {"ranks": ranks, "healthy": healthy, "hang_onset": onset_summary, "hang": hang}


def summarize_harm(raw: dict) -> dict:
    return {
        "ops": raw["ops"],
        "probes": len(raw["probes"]),
        "barriers": len(raw["barriers"]),
        "set_get_ms": quantiles_ms(raw["probes"]),
        "barrier_ms": quantiles_ms(raw["barriers"]),
        "span": [raw["start"], raw["end"]],
    }


def quantiles_ms(seconds: list) -> dict:
    if not seconds:
        return {"median": None, "p90": None}
    p90 = statistics.quantiles(seconds, n=10)[-1] if len(seconds) > 1 else seconds[0]
    return {"median": statistics.median(seconds) * 1e3, "p90": p90 * 1e3}


def problems_of(result: dict) -> list:
    """What makes a size's numbers not what their labels say: then the benchmark fails."""
    found, ranks = [], result["ranks"]
    for name in ("healthy", "hang"):
        phase = result[name]
        if phase["ops"] == 0 or phase["rounds"] == 0:
            found.append(f"{ranks} ranks, {name}: no store operation counted ({phase['rounds']} rounds)")
    if result["hang"]["latest_incident"]:
        found.append(f"{ranks} ranks: the hang opened incident {result['hang']['latest_incident']}, not incident-free")
    harm = result["healthy"]["harm"]
    if not harm or harm["probes"] == 0 or harm["barriers"] == 0:
        found.append(f"{ranks} ranks: the job's probe measured nothing")
    elif not (result["healthy"]["span"][0] <= harm["span"][0] and harm["span"][1] <= result["healthy"]["span"][1]):
        found.append(f"{ranks} ranks: the job's probe ran partly outside the healthy phase")
    return found


# ---------------------------------------------------------------- the model (an extrapolation)


def fit_line(xs: list, ys: list, through: tuple | None = None) -> tuple:
    """(a, b) of y = a + b x by least squares; `through`: the line held through that point, its slope fitted. One
    distinct x and no `through`: the line through the origin (an idle server costs next to nothing)."""
    x0, y0 = through or (statistics.fmean(xs), statistics.fmean(ys))
    sxx = sum((x - x0) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, (y0 / x0 if x0 else 0.0)
    b = sum((x - x0) * (y - y0) for x, y in zip(xs, ys)) / sxx
    return y0 - b * x0, b


def ratio(with_load, without) -> float | None:
    return with_load / without if with_load is not None and without else None


def model(results: list, baseline: dict) -> dict:
    """Lines through the measured points, read at TARGET_RANKS. Server CPU is fitted against the operations per second
    the server served (ddpwatch's and the job probe's), not against ranks, since the simulation may not have kept
    the interval; the healthy line has the no-ddpwatch measurement as one more point."""
    out: dict = {"ranks": TARGET_RANKS, "nodes": TARGET_RANKS // RANKS_PER_NODE}
    out["factor"] = TARGET_RANKS / max(r["ranks"] for r in results)
    for name in ("healthy", "hang"):
        phases = [r[name] for r in results]
        points = phases + ([baseline] if name == "healthy" else [])
        per_rank = statistics.fmean(p["ops_per_rank_interval"] for p in phases)
        needed = TARGET_RANKS * per_rank / INTERVAL
        rates = [p["all_ops_per_s"] for p in points]
        cpu = fit_line(rates, [p["server_cpu_per_s"] for p in points])
        thread = fit_line(rates, [p["server_busiest_thread_per_s"] for p in points])
        out[name] = {
            "ops_per_rank_interval": per_rank,
            "ops_per_s": needed,
            "server_cpu_line": cpu,
            "server_cpu_per_s": cpu[0] + cpu[1] * needed,
            "busiest_thread_line": thread,
            "busiest_thread_per_s": thread[0] + thread[1] * needed,
        }
    rates = [r["healthy"]["ops_per_s"] for r in results]
    for what in ("set_get_ms", "barrier_ms"):
        ratios = [ratio(r["healthy"]["harm"][what]["median"], baseline[what]["median"]) or 1.0 for r in results]
        line = fit_line(rates, ratios, through=(0.0, 1.0))  # no ddpwatch traffic: ratio 1 by definition
        # A slope at or below zero: no slowdown measured at these sizes, so there is nothing to extend.
        predicted = line[0] + line[1] * out["healthy"]["ops_per_s"] if line[1] > 0 else None
        out[what] = {"ratio_line": line, "ratio": predicted}
    return out


ASSUMPTIONS = (
    "server CPU grows linearly in the operations per second it serves (a line fitted on the measured phases)",
    "operations per rank per interval do not depend on the number of ranks (their mean over the sizes measured)",
    f"{RANKS_PER_NODE} ranks per node changes nothing here: every rank's watchdog has its own connection, so the "
    f"server holds {TARGET_RANKS:,} of them, where here {CLIENTS} connections carried every simulated rank and at "
    f"most {CLIENTS} ddpwatch requests were in flight at once; what many connections cost the server is not measured",
    "the job's round trip and barrier slow down linearly with ddpwatch's operations per second; near saturation "
    "(the busiest server thread at 1 CPU-second per second) requests queue and they grow much faster than a line",
    "on this machine the simulated ranks share the CPUs with the server and the job's probe: the harm measured "
    "includes that contention, which a server with cores of its own would not see",
)


# ---------------------------------------------------------------- output


LOAD_COLUMNS = (
    "ranks|phase|rounds|ops/rank/interval|ddpwatch ops/s measured|ops/s a real job sends|job probe's ops/s|"
    "server CPU s/s|busiest server thread s/s|server CPU us/op (all ops)|clients' CPU (cores)|"
    "slowest round of all ranks (s)"
).split("|")
HARM_COLUMNS = (
    "while|ddpwatch ops/s|server CPU s/s|probes / barriers|set+get median (ms)|p90 (ms)|vs none|"
    "barrier median (ms)|p90 (ms)|vs none"
).split("|")


def load_rows(results: list) -> list:
    rows = []
    for r in results:
        for name in ("healthy", "hang"):
            p = r[name]
            kept = "yes" if p["slowest_round_s"] <= INTERVAL else "NO: the simulation set the pace"
            rows.append(
                [
                    r["ranks"],
                    name if name == "healthy" else "hang, no incident",
                    p["rounds"],
                    f"{p['ops_per_rank_interval']:.2f}",
                    f"{p['ops_per_s']:.0f}",
                    f"{r['ranks'] * p['ops_per_rank_interval'] / INTERVAL:.0f}",
                    f"{p['job_ops_per_s']:.0f}",
                    f"{p['server_cpu_per_s']:.3f}",
                    f"{p['server_busiest_thread_per_s']:.3f}",
                    f"{1e6 * p['server_cpu_per_s'] / p['all_ops_per_s']:.1f}" if p["all_ops_per_s"] else "-",
                    f"{p['clients_cpu_per_s']:.2f}",
                    f"{p['slowest_round_s']:.3f}",
                    kept,
                ]
            )
    return rows


def harm_rows(results: list, baseline: dict) -> list:
    def row(label, harm, rate, cpu):
        sg, bar = harm["set_get_ms"], harm["barrier_ms"]
        return [
            label,
            rate,
            f"{cpu:.3f}",
            f"{harm['probes']} / {harm['barriers']}",
            sg["median"],
            sg["p90"],
            _times(ratio(sg["median"], baseline["set_get_ms"]["median"])),
            bar["median"],
            bar["p90"],
            _times(ratio(bar["median"], baseline["barrier_ms"]["median"])),
        ]

    rows = [row("no ddpwatch traffic", baseline, "0", baseline["server_cpu_per_s"])]
    for r in results:
        h = r["healthy"]
        if h["harm"] is None:
            continue  # its problem is said below the tables
        rows.append(row(f"{r['ranks']} ranks, healthy", h["harm"], f"{h['ops_per_s']:.0f}", h["server_cpu_per_s"]))
    return rows


def _times(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def model_rows(fitted: dict) -> list:
    rows = []
    for name in ("healthy", "hang"):
        m = fitted[name]
        per_rank = f"{m['ops_per_rank_interval']:.2f} per rank per interval (mean measured)"
        rows.append([f"{name}: ddpwatch operations per second", per_rank, f"{m['ops_per_s']:,.0f}"])
        for key, label in (("server_cpu", "server CPU s/s"), ("busiest_thread", "busiest server thread s/s")):
            a, b = m[f"{key}_line"]
            rows.append([f"{name}: {label}", f"{a:.3g} + ops/s x {b * 1e6:.3g} us", f"{m[f'{key}_per_s']:.2f}"])
    saturated = fitted["healthy"]["busiest_thread_per_s"] >= 1.0
    for what, label in (("set_get_ms", "set+get median"), ("barrier_ms", "store barrier median")):
        b = fitted[what]["ratio_line"][1]
        value = fitted[what]["ratio"]
        shown = "no slowdown measured: nothing to extend" if value is None else _times(value)
        shown += " (the server saturated: queueing, not a line)" if saturated and value is not None else ""
        rows.append([f"healthy: job's {label}, with / without", f"1 + {b * 1e3:.3g} per 1,000 ops/s", shown])
    return rows


def print_measurements(results: list, baseline: dict, libuv: bool) -> None:
    C.print_table(
        f"Store load: the TCPStore server in a process of its own (libuv: {libuv}), {CLIENTS} client processes "
        f"ticking real Watchdogs, rounds spread over each {INTERVAL:g} s interval; operations counted on the clients, "
        "CPU read by psutil",
        LOAD_COLUMNS + [f"kept the {INTERVAL:g} s interval"],
        load_rows(results),
    )
    print(
        "ops/s a real job sends: ranks x ops/rank/interval / interval; the measured rate falls short of it where a "
        "round took longer than the interval (then the simulation, not the server, set the pace). CPU times come in "
        "clock ticks (10 ms): over a phase of a few seconds, figures near 0.01 s/s are that coarse."
    )
    for r in results:
        onset = r["hang_onset"]
        print(
            f"{r['ranks']} ranks, the hang's onset (the round in which every rank finds itself blocked, run unpaced "
            f"before the hang phase): {onset['ops_per_rank']:.2f} ops/rank, {onset['wall_s']:.2f} s for all ranks here"
        )
    C.print_table(
        f"Store harm: the job's own store use through the same server: a set+get of 64 bytes every "
        f"{PROBE_GAP_S * 1e3:g} ms, and every {BARRIER_EVERY} a store-based barrier of {PARTICIPANTS} threads "
        "(as torch's _store_based_barrier: add 1, add 0, the last sets a key, all wait for it)",
        HARM_COLUMNS,
        harm_rows(results, baseline),
    )


def print_model(results: list, fitted: dict) -> None:
    C.print_table(
        f"Model: an EXTRAPOLATION, {fitted['factor']:,.0f} times past the largest size measured, to "
        f"{TARGET_RANKS:,} ranks ({fitted['nodes']:,} nodes of {RANKS_PER_NODE}): lines fitted by least squares to "
        f"{len(results)} sizes, read at the operations per second such a job sends",
        ["quantity", "line fitted", f"at {TARGET_RANKS:,} ranks"],
        model_rows(fitted),
    )
    print("Assumptions of the model:")
    for line in ASSUMPTIONS:
        print(f"- {line}")
    if fitted["healthy"]["busiest_thread_per_s"] >= 1.0:
        print("- by these lines the server's busiest thread would need more than a whole core: it would fall behind")
    sys.stdout.flush()


# ---------------------------------------------------------------- main


def server_hello(server: Children, mode: str) -> dict:
    """The port the server listens on (and whether it is libuv's), once it does."""
    hello = scale._readline(server.procs[0], time.monotonic() + REPLY_S[mode])
    if not hello:
        raise RuntimeError(f"the store server did not start (exit {server.procs[0].poll()})")
    return json.loads(hello)


def measure(sizes: list, mode: str) -> tuple:
    """Every child started here is killed here, by its process group, however the measurement ends."""
    probe = (PROBES[mode], HEALTHY_S[mode] - WARMUP_S - 0.5)  # the probe ends before the healthy phase does
    started: list = []
    with tempfile.TemporaryDirectory(prefix="ddpwatch-store-load-") as folder:
        try:
            server = Children("server", 1, mode, folder)
            started.append(server)
            hello = server_hello(server, mode)
            job = Children("job", 1, mode, folder, hello["port"])
            clients = Children("ranks", CLIENTS, mode, folder, hello["port"])
            started += [job, clients]
            clients.ask(["ready"] * CLIENTS)  # their imports done: the no-traffic baseline shares the CPUs with no one
            baseline = baseline_harm(server.procs[0], job, probe)
            results = [one_size(n, mode, server.procs[0], clients, job, probe) for n in sizes]
        finally:
            for children in reversed(started):
                children.kill()
    return hello, baseline, results


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--sizes", type=int, nargs="+", help="simulated ranks (default 1024 4096 16384; quick 64 256)")
    args.add_argument("--json", metavar="PATH", help="write every number here")
    args.add_argument("--role", choices=("server", "ranks", "job"), help=argparse.SUPPRESS)
    args.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    opts = args.parse_args(argv)
    mode = "quick" if opts.quick else "full"
    if opts.role:
        signal.alarm(opts.limit)  # SIGALRM's default action ends the child: it outlives a lost parent this long at most
        serve() if opts.role == "server" else {"ranks": run_ranks, "job": run_job}[opts.role](opts.port)
        return 0
    sizes = opts.sizes or list(SIZES[mode])
    if min(sizes) < 2 * CLIENTS:
        args.error(f"--sizes: at least {2 * CLIENTS} ranks, so that each of the {CLIENTS} clients carries some")
    C.header("store_load: the TCPStore server under ddpwatch's traffic", opts.quick)
    try:
        hello, baseline, results = measure(sizes, mode)
    except (RuntimeError, OSError, ValueError, psutil.Error) as failure:  # a child died or stopped answering
        print(f"FAILED: {failure!r}", flush=True)
        return 1
    problems = [p for r in results for p in problems_of(r)]
    if baseline["probes"] == 0 or baseline["barriers"] == 0:
        problems.append("the job's probe measured nothing without ddpwatch traffic")
    fitted = None if problems else model(results, baseline)  # no line through numbers that are not what they say
    print_measurements(results, baseline, hello["libuv"])
    if fitted:
        print_model(results, fitted)
    if opts.json:
        doc = {"format": 1, "quick": opts.quick, "commit": C.code_version(), "machine": C.machine()}
        doc.update(interval=INTERVAL, clients=CLIENTS, baseline=baseline, sizes=results, model=fitted)
        doc.update(assumptions=list(ASSUMPTIONS), problems=problems)
        with open(opts.json, "w") as handle:
            json.dump(doc, handle, indent=1)
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
