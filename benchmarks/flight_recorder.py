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
    finally:
        dist.destroy_process_group()
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


if __name__ == "__main__":
    raise SystemExit(main())
