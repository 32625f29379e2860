"""How the leader's assessment grows with ranks, hang by hang: linear (x4 for 4 times the ranks) or worse.

    python -m benchmarks.assess_growth [--quick]

`analysis.assess` runs on every rank's position each round a rank waits, so a pass that asks something of every
rank for every rank turns a look at thousands of ranks into seconds (a scan per ask made one at 16,384 ranks in
groups of 8 take 13 s: 0b343e9). This times the assessment on hand-built positions of eleven layouts of a hang
(look_parts' blocked position, varied), at N and 4N ranks, and prints microseconds a rank and the ratio of the two
times: about 4 where the assessment is linear in ranks, about 16 where it grows as their square. Timings are
noisy here: read a ratio far above 4, not a few tenths (tests/test_look_cost.py counts what a few of these ask).
"""

from __future__ import annotations

import gc
import time

from . import _common as C
from .look_parts import GRACE_S, TIMEOUT_S, blocked_position

SIZES = {"full": (1024, 4096), "quick": (128, 512)}


def at(rank: int, world: int, line: int = 88, group: str = "0", seq: int = 11, op: str = "barrier") -> dict:
    """A rank blocked in `op` at `line` on `group`, position `seq`, for 3 s."""
    doc = blocked_position(rank, world, line, group)
    doc["inflight"][0].update(seq=seq, op=op, api=op)
    return doc


def running(rank: int, world: int) -> dict:
    return dict(at(rank, world), inflight=[], idle_s=0.0)


def aged(rank: int, world: int) -> dict:
    doc = at(rank, world)
    doc["inflight"][0]["age_s"] = doc["idle_s"] = TIMEOUT_S + 100
    return doc


def exited(rank: int, world: int) -> dict:
    return dict(at(rank, world), status="exited")


def sending(rank: int, world: int) -> dict:
    doc = at(rank, world, op="send")
    doc["inflight"][0].update(p2p=True, peer=(rank + 1) % world)
    return doc


def sized(rank: int, world: int) -> dict:
    doc = at(rank, world, op="all_reduce")
    doc["inflight"][0].update(shapes=[[rank % 7 + 1]], dtypes=["float32"])
    return doc


LAYOUTS = {  # name -> the position of rank r of a world (None: the rank is not seen)
    "one call": at,
    "groups of 8": lambda r, w: at(r, w, group=str(1 + r // 8)),
    "rank 0 a call ahead": lambda r, w: at(r, w, seq=12 if r == 0 else 11),
    "half in another op": lambda r, w: at(r, w, op="all_reduce" if r % 2 else "barrier"),
    "a send ring": sending,
    "shapes differ": sized,
    "50 lines": lambda r, w: at(r, w, line=1000 + r % 50),
    "half exited": lambda r, w: exited(r, w) if r % 2 else at(r, w),
    "groups of 8, one exited each": lambda r, w: exited(r, w) if r % 8 == 0 else at(r, w, group=str(1 + r // 8)),
    "rank 0 runs, the rest past timeout": lambda r, w: running(r, w) if r == 0 else aged(r, w),
    "a third not seen": lambda r, w: None if r % 3 == 0 else at(r, w),
}


def assess_s(layout, world: int) -> tuple:
    """(seconds of one assessment, its verdict) of `world` ranks standing as `layout` says."""
    from ddpwatch import analysis

    states = {r: doc for r in range(world) if (doc := layout(r, world)) is not None}
    gc.collect()
    start = time.perf_counter()
    found = analysis.assess(states, world, GRACE_S, TIMEOUT_S)
    return time.perf_counter() - start, found.verdict


def main(argv=None) -> int:
    opts = C.parser(__doc__).parse_args(argv)
    mode = "quick" if opts.quick else "full"
    small, big = SIZES[mode]
    C.header("assess_growth: the assessment's time by ranks, layout by layout", opts.quick)
    rows = []
    for name, layout in LAYOUTS.items():
        (t_small, verdict), (t_big, _) = assess_s(layout, small), assess_s(layout, big)
        rows.append(
            [name, verdict or "-", f"{t_small / small * 1e6:.1f}", f"{t_big / big * 1e6:.1f}", f"{t_big / t_small:.1f}"]
        )
    C.print_table(
        f"analysis.assess on {small} and {big} ranks (one round each, the heap collected before it)",
        ["layout", "verdict", f"us a rank at {small}", f"us a rank at {big}", "ratio (4: linear, 16: squared)"],
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
