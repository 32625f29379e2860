"""Cost of reading torch's Flight Recorder, the second source for collectives Python never sees (1 gloo rank)."""

from __future__ import annotations

import json
import os
import statistics
import time

from . import _common as C

SIZES = {"full": (10, 200, 2000), "quick": (10, 200)}  # entries in the ring when it is read
READS = {"full": 30, "quick": 5}


def _median_ms(function, reads: int) -> float:
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    opts = C.parser(__doc__).parse_args(argv)
    mode = "quick" if opts.quick else "full"
    C.header("flight_recorder", opts.quick)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch
    import torch.distributed as dist
    import torch._C._distributed_c10d as c10d_c

    from ddpwatch.watch import evidence
    from ddpwatch.launch import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    rows, issued = [], 0
    try:
        for size in SIZES[mode]:
            while issued < size:
                dist.all_reduce(torch.ones(4))
                issued += 1
            entries = len(json.loads(c10d_c._dump_fr_trace_json(True, False)).get("entries") or ())
            rows.append(
                [
                    entries,
                    round(_median_ms(lambda: c10d_c._dump_fr_trace_json(True, True), READS[mode]), 3),
                    round(_median_ms(evidence.flight_recorder_active, READS[mode]), 3),
                    round(_median_ms(lambda: c10d_c._dump_fr_trace(True, False, True), READS[mode]), 3),
                    round(_median_ms(lambda: c10d_c._dump_fr_trace(), max(3, READS[mode] // 10)), 1),
                ]
            )
        feed_rows = feed_reads(mode, dist, torch, c10d_c)
    finally:
        dist.destroy_process_group()
    C.print_table(
        "The flight feed's read (watch/flight.py FlightFeed.refresh: a dump with stacks, every entry's frames placed, "
        "records made and handed to a Recorder), every entry fresh: median ms per read, and per entry; 'sampled' "
        "keeps 64 per group as the feed does, 'every entry' keeps all (what reading without sampling loss costs)",
        [
            "fresh entries",
            "entries in the ring",
            "sampled (ms)",
            "every entry (ms)",
            "sampled, per fresh entry (us)",
            "every entry, per fresh entry (us)",
        ],
        feed_rows,
    )
    C.print_table(
        "Reading the Flight Recorder (median ms per read; the watchdog reads only-active JSON, and only "
        "while a rank has no recorded collective in flight and makes no progress)",
        [
            "entries in the ring",
            "JSON dump, only active (ms)",
            "flight_recorder_active() (ms)",
            "pickle dump, only active, no stacks (ms)",
            "pickle dump with stacks (ms)",
        ],
        rows,
    )
    return 0


def feed_reads(mode: str, dist, torch, c10d_c) -> list:
    """The feed's refresh over `size` fresh entries, sampled as it runs and keeping every entry (HISTORY_KEPT raised
    past the ring), alternated; each read preceded by `size` new all_reduces, so that every entry read is fresh."""
    from ddpwatch.capture.record import Recorder
    from ddpwatch.watch import flight, flight_support

    flight_support.load_symbolizer()  # as the session does when it arms: not a read's cost
    kept = flight.HISTORY_KEPT
    rows = []
    for size in SIZES[mode][1:]:
        times: dict = {"sampled": [], "every": []}
        in_ring = 0
        for _ in range(max(3, READS[mode] // 5)):
            for how in ("sampled", "every", "every", "sampled"):
                feed = flight.FlightFeed(Recorder(4096), lambda pg: "0")
                feed.refresh(now_or_never=True)  # what is in the ring now: read, not timed
                for _ in range(size):
                    dist.all_reduce(torch.ones(4))
                in_ring = len(json.loads(c10d_c._dump_fr_trace_json(True, False)).get("entries") or ())
                flight.HISTORY_KEPT = kept if how == "sampled" else 1 << 30
                try:
                    start = time.perf_counter()
                    feed.refresh(now_or_never=True)
                    times[how].append((time.perf_counter() - start) * 1e3)
                finally:
                    flight.HISTORY_KEPT = kept
        sampled, every = statistics.median(times["sampled"]), statistics.median(times["every"])
        rows.append(
            [
                size,
                in_ring,
                round(sampled, 2),
                round(every, 2),
                round(sampled / size * 1e3, 2),
                round(every / size * 1e3, 2),
            ]
        )
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
