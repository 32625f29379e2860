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
from .store_load_report import (
    ASSUMPTIONS,
    HANG_LOOKS,
    PROTOCOLS,
    RANKS_PER_NODE,
    TARGET_RANKS,
    model,
    per_node as per_node_ops,
    print_measurements,
    print_model,
    print_replays,
)

SIZES = {"full": (1024, 4096, 16384), "quick": (64, 256)}
CLIENTS = 2  # processes carrying the simulated ranks (this machine has 2 cores); each has one store connection
INTERVAL = scale.INTERVAL  # the watchdog's default interval: every rank ticks once per interval
HEALTHY_S = {"full": 10.0, "quick": 2.0}  # the healthy phase; the job's harm probe runs inside it
HANG_S = {"full": 5.0, "quick": 2.0}
# A blocked rank's looks for an incident each interval in its first 10 s blocked (watchdog.FAST_S apart): the round's
# tick, then the looks between rounds. The hang phase is within those 10 s, as a hang's first verdict is.
LOOKS = {"healthy": 1, "hang": HANG_LOOKS}
WARMUP_S = 0.5  # ticking has begun before the job's probe starts timing
PROBES = {"full": 300, "quick": 60}  # set+get round trips per harm measurement (fewer when its time runs out)
PROBE_GAP_S = 0.01  # between probes: a job's own store use is occasional; a tight loop would be load of its own
BARRIER_EVERY = 10  # one store-based barrier per this many probes
REPLAY_MAX_OPS_S = 40_000.0  # what one Python process sends here at the most (a higher rate is asked, not reached)
REPLAY_TICK_S = 0.002  # the replay's pacing step
REPLAY_DOC_BYTES = 3000  # rank 0's completed positions, about the size a real one has
PARTICIPANTS = 4  # the barrier's participants: threads of the job process, each with its own store client
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
    """Commands on stdin, one JSON reply per line: ready, setup NAMESPACE WORLD LOW HIGH PROTOCOL, block, run SECONDS,
    quit. PROTOCOL: rank (each rank's own round trips) or node (the node relay, watch/node.py: nodes of
    RANKS_PER_NODE consecutive ranks, each node's folder of its own)."""
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
            if command[5] == "node":
                relay_nodes(dogs, command[1], int(command[2]))
            # The first round publishes whole states: a job's start, not its steady state, so it is not timed.
            reply = untimed_round(dogs, counting)
        elif command[0] == "block":
            # Every rank, rank 0 too, in the same barrier: no verdict before the timeout. The round in which the ranks
            # find themselves blocked (each reads its blocked call's source once) runs unpaced: the hang's onset.
            scale.block(recorder, leader=False)
            reply = untimed_round(dogs, counting)
        elif command[0] == "run":
            reply = paced_rounds(dogs, counting, float(command[1]), int(command[2]))
            reply["latest_incident"] = dogs[0].job.counters()[1] if dogs else 0  # after the count: not counted
        elif command[0] == "open":  # client 0 only: rank 0 opens an incident on the hang and answers it
            reply = open_incident(dogs[0], counting)
        elif command[0] == "answer":
            reply = answer_incident(dogs, counting, int(command[1]))
        elif command[0] == "collect":  # client 0 only: the leader reads every answer and builds the report
            reply = collect_incident(dogs[0], counting, int(command[1]))
        elif command[0] == "quit":
            return
        print(json.dumps(reply), flush=True)  # "ready" too: an empty reply, imports done


def open_incident(leader, counting) -> dict:
    """Rank 0 opens an incident as IncidentWriter.write does, and answers it with its full state."""
    counting.reset()
    info = {"trigger": "deadlock", "leader": leader.rank, "action": "report", "fingerprint": "store-load"}
    number = leader.job.open_incident(info)
    leader.answers.own(number)
    return {"number": number, "calls": counting.reset()}


def answer_incident(dogs: list, counting, number: int) -> dict:
    """Every other simulated rank answers incident `number` as its watchdog does at its next look: the incident's
    info read, its full state put and counted; its native stacks are said unavailable (one put, as py-spy's would
    be, without running py-spy on this process once a rank)."""
    counting.reset()
    start = time.monotonic()
    answered = 0
    for dog in dogs:
        if dog.rank == 0:
            continue
        dog.answers._native_on = False
        dog._answer_incidents(number)
        answered += dog.answers.answered == number
    calls = counting.reset()
    sent = calls.pop("bytes", 0)
    return {
        "answered": answered,
        "ops": sum(calls.values()),
        "calls": calls,
        "bytes": sent,
        "s": time.monotonic() - start,
    }


def collect_incident(leader, counting, number: int) -> dict:
    """The leader's read of every answer and what it makes of them (benchmarks/scale.py leader_pass: the gather,
    the assessment, the positions grouped, the report rendered), each timed."""
    counting.reset()
    found = scale.leader_pass(leader.job, "incident", number)
    found.pop("text", None)
    counting.reset()
    return found


LOOK_S = 0.1  # watchdog.FAST_S: a blocked rank's looks for an incident, this far apart in a real job


class NodeTime:
    """A simulated node's time, as its relays pace their reads and puts by it (NodeRelay.clock): the simulation plays
    a node's round and its looks back to back, so it sets this to what they stand for (the round's start, then
    LOOK_S more for each look)."""

    def __init__(self):
        self.now = 0.0


def relay_nodes(dogs: list, namespace: str, world_size: int) -> None:
    """Each simulated rank's store traffic through its node's relay, as a watchdog under torchrun across nodes has,
    its node's pace kept on the node's NodeTime (dog.node_time)."""
    from ddpwatch.watch.node import NodeRelay

    times: dict = {}
    for dog in dogs:
        node = f"n{dog.rank // RANKS_PER_NODE}"
        dog.node_time = times.setdefault(node, NodeTime())
        relay = NodeRelay(namespace, node, dog.rank, dog.config, world_size, dog.recorder.groups, RANKS_PER_NODE)
        relay.clock = lambda node_time=dog.node_time: node_time.now  # type: ignore[method-assign]
        dog.job.relay = relay


def untimed_round(dogs: list, counting) -> dict:
    """One round of every rank's tick as fast as it goes: its store operations and how long it took."""
    counting.reset()
    start = time.monotonic()
    for dog in dogs:
        dog.tick()
    calls = counting.reset()
    return {"ranks": len(dogs), "ops": sum(v for k, v in calls.items() if k != "bytes"), "s": time.monotonic() - start}


def paced_rounds(dogs: list, counting, seconds: float, looks: int = 1) -> dict:
    """Rounds of every rank's tick, spread over each interval as unsynchronised watchdog threads would be, for about
    `seconds`; a round that overruns its interval starts the next at once (then the simulation sets the pace). With
    `looks` > 1, each blocked rank also looks for an incident looks - 1 times a round, right after its node's ticks:
    a node's files are then as fresh as a real node's, which writes them every round (here a round of thousands of
    ranks takes seconds, and looks made after all of them found the leaders' files stale)."""
    counting.reset()
    start = time.monotonic()
    busy, begin, leader = [], start, []
    while begin < start + seconds:
        spent, first_of_node = 0.0, 0
        for dog in dogs:  # the round's start in every node's time: a real round is an interval after the last
            node_time = getattr(dog, "node_time", None)
            if node_time is not None and dog.rank % RANKS_PER_NODE == 0:
                node_time.now += INTERVAL - LOOK_S * (looks - 1)
        for i, dog in enumerate(dogs):
            ahead = begin + INTERVAL * i / len(dogs) - time.monotonic()  # this rank's turn in the interval
            if ahead > 0.001:
                time.sleep(ahead)
            tick_start = time.monotonic()
            dog.tick()
            if dog.rank == 0:  # the leader: in the hang, its round reads every position and assesses them
                leader.append(time.monotonic() - tick_start)
            if i + 1 == len(dogs) or dogs[i + 1].rank // RANKS_PER_NODE != dog.rank // RANKS_PER_NODE:
                blocked_looks(dogs[first_of_node : i + 1], looks - 1)
                first_of_node = i + 1
            spent += time.monotonic() - tick_start
        busy.append(spent)
        begin = max(begin + INTERVAL, time.monotonic())
        time.sleep(max(0.0, begin - time.monotonic()))
    calls = {k: v for k, v in counting.reset().items() if k != "bytes"}  # calls only
    return {
        "ranks": len(dogs),
        "rounds": len(busy),
        "busy": busy,
        "leader_tick_s": leader,
        "ops": sum(calls.values()),
        "calls": calls,
        "start": start,
        "end": time.monotonic(),
    }


def blocked_looks(node: list, looks: int) -> None:
    """`looks` rounds of looks for an incident by a node's blocked ranks, lowest first (as Watchdog._loop's look
    between rounds in a rank's first 10 s blocked: the counters, and a posted verdict while one is pending)."""
    for _ in range(looks):
        node_time = getattr(node[0], "node_time", None)
        if node_time is not None:
            node_time.now += LOOK_S
        for dog in node:
            if dog.registered_waiting:
                dog._answer_incidents()
                dog.policy.check_posted(dog.states.read)


def run_load(port: int) -> None:
    """ddpwatch's round trips replayed at a set rate, without the watchdogs that make them (whose CPU, on 2 cores,
    would starve the job's probe): commands 'load MIX RATE SECONDS' and 'quit'. MIX node: the node leader's round
    trip (a multi_get of the counters and rank 0's completed positions); rank: a rank's three (a put of its
    position, a read of the counters, a read of its partner's positions), in turn."""
    import datetime

    import torch.distributed as dist

    os.nice(19)  # the lowest CPU priority: on 2 shared cores it yields to the server and the probe, so what slows
    # the probe is the server's queue, not this process's CPU (it still sends at the rate asked: a fraction of a core)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    counters, partner, pos = "replay/counters", "replay/fp/0", "replay/pos/1"
    store.add(counters, 0)
    store.set(partner, json.dumps({"rank": 0, "n": 1, "pad": "x" * REPLAY_DOC_BYTES}))
    position = json.dumps({"rank": 1, "status": "running", "pad": "x" * 400})
    absent = b"\x00absent"
    mixes = {
        "node": [lambda: store.multi_get([counters, partner])],
        "rank": [
            lambda: store.multi_set([pos], [position]),
            lambda: store.compare_set(counters, absent, absent),
            lambda: store.compare_set(partner, absent, absent),
        ],
    }
    for line in sys.stdin:
        command = line.split()
        if command[0] == "quit":
            return
        ops, rate, seconds = mixes[command[1]], float(command[2]), float(command[3])
        sent, start = 0, time.monotonic()
        while (now := time.monotonic()) < start + seconds:
            due = int((now - start) * rate)  # paced: the rate asked, not as fast as it goes
            while sent < due:
                ops[sent % len(ops)]()
                sent += 1
            time.sleep(REPLAY_TICK_S)
        print(json.dumps({"ops": sent, "start": start, "end": time.monotonic()}), flush=True)


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

    def ask_first(self, command: str) -> dict:
        """One command to the first process alone (client 0 carries rank 0, the leader), and its reply."""
        proc = self.procs[0]
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        line = scale._readline(proc, time.monotonic() + self.reply_s)
        if not line:
            raise RuntimeError(f"a {self.role} process stopped or did not answer (exit {proc.poll()})")
        return json.loads(line)

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


def measured_phase(
    server, clients: Children, seconds: float, job: Children | None = None, probe=None, looks: int = 1
) -> dict:
    """Every client runs its ranks for `seconds`, the job's probe (if any) inside; numbers over the parent's window."""
    server_pid, client_pids = server.pid, [p.pid for p in clients.procs]
    server0, clients0 = cpu_sample([server_pid]), cpu_sample(client_pids)
    clients.send([f"run {seconds} {looks}"] * CLIENTS)
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
        "leader_tick_s": [s for r in replies for s in r["leader_tick_s"]],
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


def one_size(ranks: int, protocol: str, mode: str, server, clients: Children, job: Children, probe) -> dict:
    """Setup (not timed), the healthy phase with the job's probe inside it, then the hang."""
    namespace = f"load-{protocol}-{ranks}-{os.getpid()}"
    # client 0 carries rank 0, the leader; whole nodes: a node's ranks share one folder, in one process
    bounds = [ranks * i // CLIENTS // RANKS_PER_NODE * RANKS_PER_NODE for i in range(CLIENTS)] + [ranks]
    clients.ask([f"setup {namespace} {ranks} {bounds[i]} {bounds[i + 1]} {protocol}" for i in range(CLIENTS)])
    healthy = measured_phase(server, clients, HEALTHY_S[mode], job, probe, LOOKS["healthy"])
    onset = clients.ask(["block"] * CLIENTS)
    hang = measured_phase(server, clients, HANG_S[mode], looks=LOOKS["hang"])
    onset_summary = {"ops_per_rank": sum(r["ops"] for r in onset) / ranks, "wall_s": max(r["s"] for r in onset)}
    found = {"ranks": ranks, "protocol": protocol, "healthy": healthy, "hang_onset": onset_summary, "hang": hang}
    if protocol == "node":  # the answers are the same in both protocols: each rank's own, to the store
        found["incident"] = incident_phase(server, clients, ranks)
    return found


def incident_phase(server, clients: Children, ranks: int) -> dict:
    """An incident on the hang: rank 0 opens it, every rank answers (timed with the server's CPU), the leader reads
    the answers and builds the report (timed in its process)."""
    opened = clients.ask_first("open")
    number = opened["number"]
    before = cpu_sample([server.pid])
    answers = clients.ask([f"answer {number}"] * CLIENTS)
    after = cpu_sample([server.pid])
    server_cpu, busiest = cpu_rates(before, after)
    wall = after["at"] - before["at"]
    ops = sum(r["ops"] for r in answers)
    sent = sum(r["bytes"] for r in answers)
    answered = sum(r["answered"] for r in answers) + 1  # rank 0's own answer
    collected = clients.ask_first(f"collect {number}")
    return {
        "number": number,
        "answered": answered,
        "ops_per_rank": ops / max(1, answered - 1),
        "kib_per_rank": sent / 1024 / max(1, answered - 1),
        "answer_wall_s": wall,
        "server_cpu_s": server_cpu * wall,
        "server_busiest_thread_s": busiest * wall,
        "calls": {k: sum(r["calls"].get(k, 0) for r in answers) for k in {k for r in answers for k in r["calls"]}},
        "leader": collected,
    }


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
    found, ranks = [], f"{result['ranks']} ({result['protocol']})"
    for name in ("healthy", "hang"):
        phase = result[name]
        if phase["ops"] == 0 or phase["rounds"] == 0:
            found.append(f"{ranks} ranks, {name}: no store operation counted ({phase['rounds']} rounds)")
    incident = result.get("incident")
    if incident and incident["answered"] != result["ranks"]:
        found.append(f"{ranks} ranks: {incident['answered']} answered the incident, not every rank")
    if incident and incident["leader"]["states"] != result["ranks"]:
        found.append(f"{ranks} ranks: the leader read {incident['leader']['states']} answers, not every rank's")
    if result["hang"]["latest_incident"]:
        found.append(f"{ranks} ranks: the hang opened incident {result['hang']['latest_incident']}, not incident-free")
    harm = result["healthy"]["harm"]
    if not harm or harm["probes"] == 0 or harm["barriers"] == 0:
        found.append(f"{ranks} ranks: the job's probe measured nothing")
    elif not (result["healthy"]["span"][0] <= harm["span"][0] and harm["span"][1] <= result["healthy"]["span"][1]):
        found.append(f"{ranks} ranks: the job's probe ran partly outside the healthy phase")
    return found


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
            results = [one_size(n, p, mode, server.procs[0], clients, job, probe) for n in sizes for p in PROTOCOLS]
            clients.kill()  # idle from here: the replays share the CPUs with the server and the probe alone
            load = Children("load", 1, mode, folder, hello["port"])
            started.append(load)
            replays = replayed_harm(server.procs[0], load, job, probe, results)
        finally:
            for children in reversed(started):
                children.kill()
    return hello, baseline, results, replays


def replayed_harm(server, load: Children, job: Children, probe, results: list) -> list:
    """The job's store use with no traffic again, then while a load process replays each protocol's round trips at
    the rate 65,536 ranks would send them (the model's: nodes x ops per node per interval), as far as one process
    can: the harm at the server, measured, not extrapolated. Twice: every process on every core, then the server
    alone on a core of its own (as torchrun's agent, which hosts it, has on a real node), the load and the probe on
    the others, which separates the server's queue from the scheduling of three busy processes on two cores."""
    rows = []
    cpus = sorted(os.sched_getaffinity(0))
    layouts = [("shared", None)] + ([("server alone", cpus[:1])] if len(cpus) > 1 else [])
    for layout, server_cpus in layouts:
        if server_cpus is not None:
            pin(server.pid, server_cpus)
            for other in load.procs + job.procs:
                pin(other.pid, cpus[1:])
        try:
            rows += [dict(row, cpus=layout) for row in replays_of(server, load, job, probe, results)]
        finally:
            for pid in [server.pid] + [p.pid for p in load.procs + job.procs]:
                pin(pid, cpus)
    return rows


def pin(pid: int, cpus: list) -> None:
    """Every thread of a process on `cpus` (sched_setaffinity takes one thread: a process's others keep theirs)."""
    for thread in psutil.Process(pid).threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile


def replays_of(server, load: Children, job: Children, probe, results: list) -> list:
    rows = [dict(baseline_harm(server, job, probe), mix="none", asked=0.0, achieved=0.0)]
    for protocol in PROTOCOLS:
        per_node = [per_node_ops(r["healthy"]) for r in results if r["protocol"] == protocol]
        asked = TARGET_RANKS // RANKS_PER_NODE * statistics.fmean(per_node) / INTERVAL
        rate = min(asked, REPLAY_MAX_OPS_S)
        before = cpu_sample([server.pid])
        load.send([f"load {protocol} {rate} {probe[1] + WARMUP_S + 0.5}"])
        time.sleep(WARMUP_S)
        [harm] = job.ask([f"measure {probe[0]} {probe[1]}"])
        [sent] = load.collect()
        after = cpu_sample([server.pid])
        server_cpu, busiest = cpu_rates(before, after)
        achieved = sent["ops"] / (sent["end"] - sent["start"])
        row = dict(summarize_harm(harm), mix=protocol, asked=asked, achieved=achieved)
        rows.append(dict(row, server_cpu_per_s=server_cpu, server_busiest_thread_per_s=busiest))
    return rows


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--sizes", type=int, nargs="+", help="simulated ranks (default 1024 4096 16384; quick 64 256)")
    args.add_argument("--json", metavar="PATH", help="write every number here")
    args.add_argument("--role", choices=("server", "ranks", "job", "load"), help=argparse.SUPPRESS)
    args.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    opts = args.parse_args(argv)
    mode = "quick" if opts.quick else "full"
    if opts.role:
        signal.alarm(opts.limit)  # SIGALRM's default action ends the child: it outlives a lost parent this long at most
        roles = {"ranks": run_ranks, "job": run_job, "load": run_load}
        serve() if opts.role == "server" else roles[opts.role](opts.port)
        return 0
    sizes = opts.sizes or list(SIZES[mode])
    if min(sizes) < 2 * CLIENTS:
        args.error(f"--sizes: at least {2 * CLIENTS} ranks, so that each of the {CLIENTS} clients carries some")
    C.header("store_load: the TCPStore server under ddpwatch's traffic", opts.quick)
    try:
        hello, baseline, results, replays = measure(sizes, mode)
    except (RuntimeError, OSError, ValueError, psutil.Error) as failure:  # a child died or stopped answering
        print(f"FAILED: {failure!r}", flush=True)
        return 1
    problems = [p for r in results for p in problems_of(r)]
    for row in replays:
        if row["probes"] == 0 or (row["mix"] != "none" and not row["achieved"]):
            problems.append(f"the {row['mix']} replay measured nothing")
    if baseline["probes"] == 0 or baseline["barriers"] == 0:
        problems.append("the job's probe measured nothing without ddpwatch traffic")
    fitted = None if problems else model(results, baseline, INTERVAL)  # no line through numbers that are not so
    harm_title = (
        f"Store harm: the job's own store use through the same server: a set+get of 64 bytes every "
        f"{PROBE_GAP_S * 1e3:g} ms, and every {BARRIER_EVERY} a store-based barrier of {PARTICIPANTS} threads "
        "(as torch's _store_based_barrier: add 1, add 0, the last sets a key, all wait for it)"
    )
    print_measurements(results, baseline, hello["libuv"], INTERVAL, harm_title)
    if fitted:
        print_model(fitted)
    print_replays(replays, REPLAY_MAX_OPS_S)
    if opts.json:
        doc = {"format": 1, "quick": opts.quick, "commit": C.code_version(), "machine": C.machine()}
        doc.update(interval=INTERVAL, clients=CLIENTS, baseline=baseline, sizes=results, model=fitted, replays=replays)
        doc.update(assumptions=list(ASSUMPTIONS), problems=problems)
        with open(opts.json, "w") as handle:
            json.dump(doc, handle, indent=1)
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
