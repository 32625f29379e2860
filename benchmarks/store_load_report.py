"""store_load's tables and its model (an extrapolation to 65,536 ranks), on the plain numbers the measurement made."""

from __future__ import annotations

import statistics

from . import _common as C

TARGET_RANKS, RANKS_PER_NODE = 65536, 8  # the model's prediction: nodes of 8 ranks
PROTOCOLS = ("rank", "node")  # each rank's own round trips; the node relay (watch/node.py)
GRACE_S = 0.5  # ddpwatch's default grace: every rank blocked this long before a deadlock counts as proven
HANG_LOOKS = 10  # a blocked rank's looks for an incident an interval, its round's included (its first 10 s blocked)

ASSUMPTIONS = (
    "server CPU grows linearly in the operations per second it serves (one line fitted on every measured phase of "
    "both protocols: what an operation costs the server does not depend on who sends it)",
    "operations per node per interval do not depend on the number of nodes (their mean over the sizes measured), "
    "but for a hang's node leaders' reads, which watch/node.py paces by the job's nodes (JOB_LOOKS_PER_S): in the "
    "node protocol's hang row they are computed for the target's nodes, the rest measured",
    f"{RANKS_PER_NODE} ranks per node; every watchdog has its own connection, so the server holds {TARGET_RANKS:,} "
    "of them, where here 2 connections carried every simulated rank and at most 2 ddpwatch requests were in flight "
    "at once: what many connections cost the server is not measured",
    "the job's round trip and barrier slow down linearly with ddpwatch's operations per second; near saturation "
    "(the busiest server thread at 1 CPU-second per second) requests queue and they grow much faster than a line",
    "the leader's look (every rank's position read, then assessed) grows linearly with ranks (a line fitted on the "
    "hang phases); the verdict adds `grace` before it and the incident's answers after it, which are not simulated",
    "on this machine the simulated ranks share the CPUs with the server and the job's probe: the harm measured "
    "includes that contention, which a server with cores of its own would not see",
)


def fit_line(xs: list, ys: list, through: tuple | None = None) -> tuple:
    """(a, b) of y = a + b x by least squares; `through`: the line held through that point, its slope fitted. One
    distinct x and no `through`: the line through the origin."""
    if through is not None:
        x0, y0 = through
    elif len(set(xs)) < 2:
        x0, y0 = 0.0, 0.0
    else:
        x0, y0 = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - x0) ** 2 for x in xs)
    if not sxx:
        return y0, 0.0
    b = sum((x - x0) * (y - y0) for x, y in zip(xs, ys)) / sxx
    return y0 - b * x0, b


def ratio(with_load, without) -> float | None:
    return with_load / without if with_load is not None and without else None


def per_node(phase: dict) -> float:
    return phase["ops_per_rank_interval"] * RANKS_PER_NODE


def reads_per_node(phase: dict) -> float:
    """The node leaders' reads of the counters a node an interval (multi_get; rank 0's reads of every position are
    the multi_gets that follow a check, one a slice)."""
    calls = phase.get("calls") or {}
    rank_rounds = phase["ops"] / phase["ops_per_rank_interval"] if phase["ops_per_rank_interval"] else 0.0
    reads = calls.get("multi_get", 0) - calls.get("check", 0)
    return reads * RANKS_PER_NODE / rank_rounds if rank_rounds else 0.0


def leader_reads_at(nodes: int, looks: int) -> float:
    """A blocked node leader's reads an interval in a job of `nodes` (watch/node.py: JOB_LOOKS_PER_S caps the job's)."""
    from ddpwatch.watch.node import JOB_LOOKS_PER_S

    return float(looks) if nodes * looks <= JOB_LOOKS_PER_S else JOB_LOOKS_PER_S / nodes


def leader_look_s(phase: dict) -> float | None:
    """The leader's round in the hang, median: every position read and assessed (the look a verdict rests on)."""
    ticks = phase.get("leader_tick_s") or []
    return statistics.median(ticks) if ticks else None


def incident_model(incidents: list) -> dict:
    """An incident at TARGET_RANKS: every rank's answer (ops and bytes per answer, their mean; the server's CPU for
    them by the line fitted on the phases), and the leader's report (each of its parts a line in ranks)."""
    ops = statistics.fmean(r["incident"]["ops_per_rank"] for r in incidents)
    kib = statistics.fmean(r["incident"]["kib_per_rank"] for r in incidents)
    ranks = [r["ranks"] for r in incidents]
    parts = {}
    for part in ("gather", "assess", "positions", "render"):
        line = fit_line(ranks, [r["incident"]["leader"]["times"][part] for r in incidents])
        parts[part] = (line, line[0] + line[1] * TARGET_RANKS)
    answers_per_s_cpu = [r["incident"]["server_cpu_s"] / max(1, r["incident"]["answered"] - 1) for r in incidents]
    return {
        "ops_per_answer": ops,
        "kib_per_answer": kib,
        "ops": ops * TARGET_RANKS,
        "gib": kib * TARGET_RANKS / 2**20,
        "server_cpu_s_measured_per_answer": statistics.fmean(answers_per_s_cpu) * TARGET_RANKS,
        "parts": parts,
        "report_s": sum(value for _, value in parts.values()),
    }


def model(results: list, baseline: dict, interval: float) -> dict:
    """Lines through the measured points, read at TARGET_RANKS for each protocol."""
    nodes = TARGET_RANKS // RANKS_PER_NODE
    phases = [r[name] for r in results for name in ("healthy", "hang")] + [baseline]
    rates = [p["all_ops_per_s"] for p in phases]
    cpu = fit_line(rates, [p["server_cpu_per_s"] for p in phases])
    thread = fit_line(rates, [p["server_busiest_thread_per_s"] for p in phases])
    healthy_rates = [r["healthy"]["ops_per_s"] for r in results]
    harm = {}
    for what in ("set_get_ms", "barrier_ms"):
        ratios = [ratio(r["healthy"]["harm"][what]["median"], baseline[what]["median"]) or 1.0 for r in results]
        harm[what] = fit_line(healthy_rates, ratios, through=(0.0, 1.0))  # no ddpwatch traffic: ratio 1
    looks = [(r["ranks"], leader_look_s(r["hang"])) for r in results if leader_look_s(r["hang"]) is not None]
    look = fit_line([n for n, _ in looks], [s for _, s in looks])
    out: dict = {"ranks": TARGET_RANKS, "nodes": nodes, "factor": TARGET_RANKS / max(r["ranks"] for r in results)}
    out.update(server_cpu_line=cpu, busiest_thread_line=thread, harm_lines=harm, look_line=look)
    out["look_s"] = look[0] + look[1] * TARGET_RANKS
    incidents = [r for r in results if r.get("incident")]
    if incidents:
        out["incident"] = incident_model(incidents)
    out["verdict_s_without_answers"] = GRACE_S + out["look_s"]
    for protocol in sorted({r["protocol"] for r in results}):
        mine = [r for r in results if r["protocol"] == protocol]
        node_ops = statistics.fmean(per_node(r["healthy"]) for r in mine)
        hang_node_ops = statistics.fmean(per_node(r["hang"]) for r in mine)
        if protocol == "node":  # its leaders' reads depend on the job's nodes: the rest measured, the reads at target
            rest = statistics.fmean(per_node(r["hang"]) - reads_per_node(r["hang"]) for r in mine)
            hang_node_ops = rest + leader_reads_at(nodes, HANG_LOOKS)
        needed = nodes * node_ops / interval
        row = {"ops_per_node_interval": node_ops, "hang_ops_per_node_interval": hang_node_ops, "ops_per_s": needed}
        row["server_cpu_per_s"] = cpu[0] + cpu[1] * needed
        row["busiest_thread_per_s"] = thread[0] + thread[1] * needed
        row["hang_ops_per_s"] = nodes * hang_node_ops / interval  # a hang's first 10 s: the looks are in it
        row["hang_busiest_thread_per_s"] = thread[0] + thread[1] * row["hang_ops_per_s"]
        for what, line in harm.items():
            row[what] = line[0] + line[1] * needed if line[1] > 0 else None  # no slope: nothing measured to extend
        out[protocol] = row
    return out


LOAD_COLUMNS = (
    "protocol|ranks|phase|rounds|ops/rank/interval|ops/node/interval|ddpwatch ops/s measured|ops/s a real job sends|"
    "server CPU s/s|busiest server thread s/s|server CPU us/op (all ops)|clients' CPU (cores)|"
    "slowest round of all ranks (s)|leader's look (s, median)"
).split("|")
HARM_COLUMNS = (
    "while|ddpwatch ops/s|server CPU s/s|probes / barriers|set+get median (ms)|p90 (ms)|vs none|"
    "barrier median (ms)|p90 (ms)|vs none"
).split("|")


def load_rows(results: list, interval: float) -> list:
    rows = []
    for r in results:
        for name in ("healthy", "hang"):
            p = r[name]
            kept = "yes" if p["slowest_round_s"] <= interval else "NO: the simulation set the pace"
            look = leader_look_s(p) if name == "hang" else None
            rows.append(
                [
                    r["protocol"],
                    r["ranks"],
                    name if name == "healthy" else "hang, no incident, looks",
                    p["rounds"],
                    f"{p['ops_per_rank_interval']:.3f}",
                    f"{per_node(p):.2f}",
                    f"{p['ops_per_s']:.0f}",
                    f"{r['ranks'] * p['ops_per_rank_interval'] / interval:.0f}",
                    f"{p['server_cpu_per_s']:.3f}",
                    f"{p['server_busiest_thread_per_s']:.3f}",
                    f"{1e6 * p['server_cpu_per_s'] / p['all_ops_per_s']:.1f}" if p["all_ops_per_s"] else "-",
                    f"{p['clients_cpu_per_s']:.2f}",
                    f"{p['slowest_round_s']:.3f}",
                    "-" if look is None else f"{look:.3f}",
                    kept,
                ]
            )
    return rows


def harm_rows(results: list, baseline: dict) -> list:
    def row(label, harm, rate, cpu):
        return [label, rate, f"{cpu:.3f}", *probe_cells(harm, baseline)]

    rows = [row("no ddpwatch traffic", baseline, "0", baseline["server_cpu_per_s"])]
    for r in results:
        h = r["healthy"]
        if h["harm"] is not None:  # else its problem is said below the tables
            label = f"{r['ranks']} ranks ({r['protocol']}), healthy"
            rows.append(row(label, h["harm"], f"{h['ops_per_s']:.0f}", h["server_cpu_per_s"]))
    return rows


def probe_cells(harm: dict, baseline: dict) -> list:
    """The job probe's columns of a harm row: probes and barriers, then each one's median, p90 and ratio to none."""
    sg, bar = harm["set_get_ms"], harm["barrier_ms"]
    return [
        f"{harm['probes']} / {harm['barriers']}",
        sg["median"],
        sg["p90"],
        _times(ratio(sg["median"], baseline["set_get_ms"]["median"])),
        bar["median"],
        bar["p90"],
        _times(ratio(bar["median"], baseline["barrier_ms"]["median"])),
    ]


def _times(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def model_rows(fitted: dict) -> list:
    a, b = fitted["server_cpu_line"]
    ta, tb = fitted["busiest_thread_line"]
    rows = []
    for protocol in PROTOCOLS:
        m = fitted.get(protocol)
        if m is None:
            continue
        saturated = " (saturated: queueing, not a line)" if m["busiest_thread_per_s"] >= 1.0 else ""
        rows += [
            [protocol, "healthy ops per node per interval", "mean measured", f"{m['ops_per_node_interval']:.2f}"],
            [protocol, "healthy ops/s at the server", "nodes x that / interval", f"{m['ops_per_s']:,.0f}"],
            [protocol, "server CPU s/s", f"{a:.3g} + ops/s x {b * 1e6:.3g} us", f"{m['server_cpu_per_s']:.2f}"],
            [
                protocol,
                "busiest server thread s/s",
                f"{ta:.3g} + ops/s x {tb * 1e6:.3g} us",
                f"{m['busiest_thread_per_s']:.2f}",
            ],
        ]
        hang_saturated = " (over one thread: queueing)" if m["hang_busiest_thread_per_s"] >= 1.0 else ""
        rows += [
            [
                protocol,
                "hang ops per node per interval (first 10 s)",
                "mean measured" if protocol == "rank" else "measured; leaders' reads paced by nodes",
                f"{m['hang_ops_per_node_interval']:.2f}",
            ],
            [protocol, "hang ops/s at the server", "nodes x that / interval", f"{m['hang_ops_per_s']:,.0f}"],
            [
                protocol,
                "busiest server thread s/s in the hang",
                f"{ta:.3g} + ops/s x {tb * 1e6:.3g} us",
                f"{m['hang_busiest_thread_per_s']:.2f}{hang_saturated}",
            ],
        ]
        for what, label in (("set_get_ms", "job's set+get"), ("barrier_ms", "job's store barrier")):
            value = m[what]
            shown = "no slowdown measured: nothing to extend" if value is None else _times(value) + saturated
            slope = fitted["harm_lines"][what][1]
            rows.append([protocol, f"{label}, with / without", f"1 + {slope * 1e3:.3g} per 1,000 ops/s", shown])
    la, lb = fitted["look_line"]
    rows.append(
        [
            "both",
            "leader's look (every position read, assessed)",
            f"{la:.3g} + ranks x {lb * 1e6:.3g} us",
            f"{fitted['look_s']:.2f} s",
        ]
    )
    rows.append(
        [
            "both",
            "verdict, without the incident's answers",
            "grace + look",
            f"{fitted['verdict_s_without_answers']:.2f} s",
        ]
    )
    inc = fitted.get("incident")
    if inc:
        rows += [
            ["both", "an incident's answers: operations", f"ranks x {inc['ops_per_answer']:.2f}", f"{inc['ops']:,.0f}"],
            [
                "both",
                "an incident's answers: bytes",
                f"ranks x {inc['kib_per_answer']:.1f} KiB",
                f"{inc['gib']:.2f} GiB",
            ],
            [
                "both",
                "an incident's answers: server CPU",
                "measured per answer x ranks",
                f"{inc['server_cpu_s_measured_per_answer']:.1f} s",
            ],
        ]
        for part, ((a, b), value) in inc["parts"].items():
            rows.append(
                ["both", f"the leader's report: {part}", f"{a:.3g} + ranks x {b * 1e6:.3g} us", f"{value:.1f} s"]
            )
        rows.append(
            ["both", "the leader's report, once the answers are in", "the four above", f"{inc['report_s']:.1f} s"]
        )
    return rows


def print_measurements(results: list, baseline: dict, libuv: bool, interval: float, note: str) -> None:
    C.print_table(
        f"Store load: the TCPStore server in a process of its own (libuv: {libuv}), 2 client processes ticking real "
        f"Watchdogs, rounds spread over each {interval:g} s interval; nodes of {RANKS_PER_NODE} ranks; operations "
        "counted on the clients, CPU read by psutil",
        LOAD_COLUMNS + [f"kept the {interval:g} s interval"],
        load_rows(results, interval),
    )
    print(
        "ops/s a real job sends: ranks x ops/rank/interval / interval; the measured rate falls short of it where a "
        "round took longer than the interval (then the simulation, not the server, set the pace). CPU times come in "
        "clock ticks (10 ms): figures near 0.01 s/s are that coarse. In the hang every rank waits in one barrier and "
        "looks for an incident 10 times an interval (its first 10 s blocked). Rank protocol: each rank puts its own "
        "position each round and looks at the store. Node protocol: each rank's first blocked round puts its own (the "
        "onset, below); its later rounds go through its node's blocked leader, which puts them at most twice a round "
        "and reads the store for the node at its looks (each look up to 1,638 nodes, fewer past that: "
        "node.JOB_LOOKS_PER_S), the others reading its post."
    )
    for r in results:
        onset = r["hang_onset"]
        print(
            f"{r['ranks']} ranks ({r['protocol']}), the hang's onset (the round in which every rank finds itself "
            f"blocked, unpaced): {onset['ops_per_rank']:.2f} ops/rank, {onset['wall_s']:.2f} s for all ranks here"
        )
    C.print_table(note, HARM_COLUMNS, harm_rows(results, baseline))
    print_incidents(results)


INCIDENT_COLUMNS = (
    "ranks|answered|ops per answer|KiB per answer|server CPU s (all answers)|server CPU us per answer|"
    "leader: gather (s)|assess (s)|positions grouped (s)|render (s)|MiB read|leader's RSS held (MiB)"
).split("|")


def incident_rows(results: list) -> list:
    rows = []
    for r in results:
        inc = r.get("incident")
        if not inc:
            continue
        times = inc["leader"]["times"]
        per_answer_us = inc["server_cpu_s"] / max(1, inc["answered"] - 1) * 1e6
        rows.append(
            [
                r["ranks"],
                inc["answered"],
                f"{inc['ops_per_rank']:.2f}",
                f"{inc['kib_per_rank']:.1f}",
                f"{inc['server_cpu_s']:.2f}",
                f"{per_answer_us:.0f}",
                f"{times['gather']:.3f}",
                f"{times['assess']:.3f}",
                f"{times['positions']:.3f}",
                f"{times['render']:.3f}",
                f"{inc['leader']['mib']:.1f}",
                f"{inc['leader']['held_mib']:.0f}",
            ]
        )
    return rows


def print_incidents(results: list) -> None:
    rows = incident_rows(results)
    if rows:
        C.print_table(
            "An incident on the hang (node protocol; the answers go to the store from each rank in both): rank 0 "
            "opens it, every rank answers as its watchdog does (the incident's info read, its full state put and "
            "counted, its native stacks said unavailable: one put, as py-spy's would be), then the leader reads every "
            "answer and builds the report (benchmarks/scale.py leader_pass), in the simulation's process; server CPU "
            "by psutil over the answers (CPU ticks are 10 ms)",
            INCIDENT_COLUMNS,
            rows,
        )


def print_model(fitted: dict) -> None:
    C.print_table(
        f"Model: an EXTRAPOLATION, {fitted['factor']:,.0f} times past the largest size measured, to "
        f"{TARGET_RANKS:,} ranks ({fitted['nodes']:,} nodes of {RANKS_PER_NODE}): lines fitted by least squares to "
        "the measured phases, read at what such a job sends",
        ["protocol", "quantity", "line fitted", f"at {TARGET_RANKS:,} ranks"],
        model_rows(fitted),
    )
    print("Assumptions of the model:")
    for line in ASSUMPTIONS:
        print(f"- {line}")


def print_replays(replays: list, most: float) -> None:
    rows = []
    for row in replays:
        if row["mix"] == "none":
            baseline = row  # each layout's rows compare with its own baseline, measured just before them
        asked = f"{row['asked']:,.0f}" + ("" if row["asked"] <= most else " (not reached)")
        asked = "-" if row["mix"] == "none" else asked
        cells = [row.get("cpus", "shared"), row["mix"], asked, f"{row['achieved']:,.0f}"]
        rows.append(cells + [f"{row['server_cpu_per_s']:.3f}"] + probe_cells(row, baseline))
    C.print_table(
        f"Store harm at the rate {TARGET_RANKS:,} ranks would send (the model's), replayed by one load process at the "
        "lowest CPU priority (nice 19), the watchdogs gone (their CPU would starve the probe on 2 cores): the "
        "server's side of the harm, measured; cpus: shared (every process on every core), or server alone (the "
        "server's threads on one core, the load and the probe on the other)",
        ["cpus", "replayed", "asked ops/s", "achieved ops/s", "server CPU s/s", "probes / barriers"] + HARM_COLUMNS[4:],
        rows,
    )
