"""Where the leader's look at a hang goes, rank by rank: decoding the positions, checking them, assessing them.

    python -m benchmarks.look_parts [--quick] [--ranks N]

The look that a verdict at scale waits on (watch/watchdog.py `watch`) reads every rank's position from the store,
decodes it (`state_store._decode_all`), checks it against the format (`validate.published_state`) and assesses
them all (`analysis.assess`). This times the three parts apart in one process, on positions as a blocked rank
publishes them (a barrier in flight, the main thread's stack), every rank in the same call: the store's round
trips are left out (docs/scale.md measures them with a real server). Prints microseconds a rank per part, the
median of the rounds; exits 1 when a part did not see every rank (what it times did not happen).
"""

from __future__ import annotations

import statistics
import time

from . import _common as C

RANKS = {"full": 16384, "quick": 1024}
ROUNDS = {"full": 5, "quick": 2}
GRACE_S, TIMEOUT_S = 0.5, 300.0


def blocked_position(rank: int, world_size: int) -> dict:
    """A position as store.position() leaves a rank's state blocked in a barrier for 3 s (about 870 bytes)."""
    torch_file = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    site = {"file": "/u/train.py", "line": 88, "function": "train"}
    record = {
        "seq": 11,
        "group": "0",
        "op": "barrier",
        "api": "barrier",
        "p2p": False,
        "peer": None,
        "shapes": [],
        "dtypes": [],
        "site": site,
        "region": None,
        "start": 1_700_000_000.0,
        "age_s": 3.0,
        "duration_s": None,
        "state": "in_flight",
        "error": None,
        "thread": "MainThread",
    }
    frames = [
        {"file": "/u/train.py", "line": 120, "function": "main", "internal": False},
        {**site, "internal": False},
        {"file": torch_file, "line": 2400, "function": "barrier", "internal": True},
        {"file": torch_file, "line": 80, "function": "wrapper", "internal": True},
    ]
    return {
        "rank": rank,
        "pid": 10_000 + rank,
        "host": f"node{rank // 8}",
        "beat": 5,
        "status": "running",
        "progress": 1,
        "idle_s": 3.0,
        "inflight": [record],
        "groups": {"0": None},
        "stacks": [{"thread": "MainThread", "main": True, "frames": frames}],
        "world_size": world_size,
    }


def one_round(raw: list, world_size: int) -> dict:
    """Seconds for each part over every rank, and how many ranks each part saw."""
    from ddpwatch import analysis
    from ddpwatch.format import validate
    from ddpwatch.watch.state_store import _decode_all

    keys = list(range(len(raw)))
    start = time.perf_counter()
    docs = _decode_all(keys, raw)
    decoded = time.perf_counter()
    checked = {rank: doc for rank, doc in docs.items() if validate.published_state(doc, world_size)}
    validated = time.perf_counter()
    analysis.assess(checked, world_size, GRACE_S, TIMEOUT_S)
    assessed = time.perf_counter()
    blocked = sum(1 for state in checked.values() if analysis.is_blocked(state, GRACE_S))
    return {
        "decode": decoded - start,
        "checks": validated - decoded,
        "assess": assessed - validated,
        "seen": min(len(docs), len(checked), blocked),
    }


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--ranks", type=int, help="positions to look at (default 16384; quick 1024)")
    opts = args.parse_args(argv)
    mode = "quick" if opts.quick else "full"
    ranks = opts.ranks or RANKS[mode]
    C.header("look_parts: the leader's look at a hang, part by part", opts.quick)
    from ddpwatch.format import documents
    from ddpwatch.watch.store import position

    raw = [documents.dumps(position(blocked_position(r, ranks))).encode() for r in range(ranks)]
    rounds = [one_round(raw, ranks) for _ in range(ROUNDS[mode])]
    parts = ("decode", "checks", "assess")
    per_rank = {part: statistics.median(r[part] for r in rounds) / ranks * 1e6 for part in parts}
    C.print_table(
        f"{ranks} positions of {len(raw[0])} bytes, every rank blocked in one barrier; median of {len(rounds)} rounds",
        ["part", "us a rank", "s for every rank", f"s at 65,536 ranks (x {65536 / ranks:g})"],
        [
            [part, f"{per_rank[part]:.1f}", f"{per_rank[part] * ranks / 1e6:.3f}", f"{per_rank[part] * 0.065536:.2f}"]
            for part in parts
        ]
        + [["all three", f"{sum(per_rank.values()):.1f}", "", f"{sum(per_rank.values()) * 0.065536:.2f}"]],
    )
    missed = [r["seen"] for r in rounds if r["seen"] != ranks]
    if missed:
        print(f"FAILED: a part saw {missed[0]} of {ranks} ranks blocked: what it times did not happen")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
