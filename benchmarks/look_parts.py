"""Where the leader's look at a hang goes, rank by rank: reading the positions (decode and checks), assessing them.

    python -m benchmarks.look_parts [--quick] [--ranks N]

The look that a verdict at scale waits on (watch/watchdog.py `watch`) reads every rank's position from the store,
decodes and checks it against the format (`JobProtocol.positions`: watch/position_text.py `read`) and assesses
them all (`analysis.assess`). This times the parts apart in one process, on position texts as a blocked rank
publishes them (a barrier in flight, the main thread's stack; each rank its own pid, host, start and age), in three
layouts: every rank in the same call at the same line (a hang), each 8 ranks in a group of their own (a hang in a
tensor-parallel collective), and every rank at a line of its own (each where distinct: the most a read can
cost). The store's round trips are left out (docs/scale.md measures them with a real server). Prints microseconds
a rank per part, the median of the rounds; exits 1 when a part did not see every rank (what it times did not
happen).
"""

from __future__ import annotations

import gc
import statistics
import time

from . import _common as C

RANKS = {"full": 16384, "quick": 1024}
ROUNDS = {"full": 5, "quick": 2}
GRACE_S, TIMEOUT_S = 0.5, 300.0


def blocked_position(rank: int, world_size: int, line: int = 88, group: str = "0") -> dict:
    """A position as store.position() leaves a rank's state blocked in a barrier for about 3 s (about 870 bytes,
    with the main thread's stack, which a real position leaves out), its call made at `line` on `group`; its pid,
    host, start and age its own."""
    torch_file = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    site = {"file": "/u/train.py", "line": line, "function": "train"}
    age = 3.0 + (rank % 997) * 1e-4
    record = {
        "seq": 11,
        "group": group,
        "op": "barrier",
        "api": "barrier",
        "p2p": False,
        "peer": None,
        "shapes": [],
        "dtypes": [],
        "site": site,
        "region": None,
        "start": 1_700_000_000.0 + rank * 1e-6,
        "age_s": age,
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
        "idle_s": age,
        "inflight": [record],
        "groups": {"0": None} if group == "0" else {group: list(range(rank // 8 * 8, rank // 8 * 8 + 8))},
        "stacks": [{"thread": "MainThread", "main": True, "frames": frames}],
        "world_size": world_size,
    }


def position_text(state: dict) -> bytes:
    """The text JobProtocol.publish() puts at a rank's position key (before 45b16dd: the position as one object)."""
    from ddpwatch.format import documents
    from ddpwatch.watch.store import _with_beat, position

    shown = position(state)
    text = _text_module()
    if text is None:
        return documents.dumps(shown).encode()
    beat = shown.pop("beat", None)
    own, where = text.texts(shown)
    return _with_beat(own, beat, where).encode()


def _text_module():
    """watch/position_text.py, or None in a ddpwatch older than it (run with an older one on PYTHONPATH to compare)."""
    try:
        from ddpwatch.watch import position_text as text
    except ImportError:
        return None
    return text


def read_positions(raw: list, world_size: int) -> dict:
    """{rank: position} as JobProtocol.positions() reads them after its round trips (before 45b16dd: every value
    decoded in one parser call, then each checked)."""
    from ddpwatch.format import validate
    from ddpwatch.watch import state_store

    text = _text_module()
    if text is not None:
        return {rank: doc for rank, doc in enumerate(text.read(raw, world_size)) if type(doc) is dict}
    docs = state_store._decode_all(list(range(len(raw))), raw)
    return {rank: doc for rank, doc in docs.items() if validate.published_state(doc, world_size)}


def one_round(raw: list, world_size: int) -> dict:
    """Seconds for each part over every rank, and how many ranks each part saw."""
    from ddpwatch import analysis

    gc.collect()  # each round from a collected heap: else a round pays for the garbage of the one before, or not
    start = time.perf_counter()
    docs = read_positions(raw, world_size)
    read = time.perf_counter()
    analysis.assess(docs, world_size, GRACE_S, TIMEOUT_S)
    assessed = time.perf_counter()
    blocked = sum(1 for state in docs.values() if analysis.is_blocked(state, GRACE_S))
    return {"read": read - start, "assess": assessed - read, "seen": min(len(docs), blocked)}


# how the ranks stand: (the line of their call, its group)
LAYOUTS = {
    "one call": lambda rank: (88, "0"),
    "a group of 8 ranks each (tensor parallel)": lambda rank: (88, str(1 + rank // 8)),
    "every line its own": lambda rank: (1000 + rank, "0"),
}


def main(argv=None) -> int:
    args = C.parser(__doc__)
    args.add_argument("--ranks", type=int, help="positions to look at (default 16384; quick 1024)")
    opts = args.parse_args(argv)
    mode = "quick" if opts.quick else "full"
    ranks = opts.ranks or RANKS[mode]
    C.header("look_parts: the leader's look at a hang, part by part", opts.quick)
    missed = []
    for layout, where_of in LAYOUTS.items():
        raw = [position_text(blocked_position(r, ranks, *where_of(r))) for r in range(ranks)]
        rounds = [one_round(raw, ranks) for _ in range(ROUNDS[mode])]
        parts = ("read", "assess")
        per_rank = {part: statistics.median(r[part] for r in rounds) / ranks * 1e6 for part in parts}
        C.print_table(
            f"{layout}: {ranks} positions of {len(raw[0])} bytes, every rank blocked in a barrier; median of "
            f"{len(rounds)} rounds",
            ["part", "us a rank", "s for every rank", f"s at 65,536 ranks (x {65536 / ranks:g})"],
            [
                [
                    part,
                    f"{per_rank[part]:.1f}",
                    f"{per_rank[part] * ranks / 1e6:.3f}",
                    f"{per_rank[part] * 0.065536:.2f}",
                ]
                for part in parts
            ]
            + [["both", f"{sum(per_rank.values()):.1f}", "", f"{sum(per_rank.values()) * 0.065536:.2f}"]],
        )
        missed += [(layout, r["seen"]) for r in rounds if r["seen"] != ranks]
    if missed:
        print(
            f"FAILED: {missed[0][0]}: a part saw {missed[0][1]} of {ranks} ranks blocked: what it times did not happen"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
