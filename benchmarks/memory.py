"""The recorder's memory per rank at the default ring size, and that it stays bounded over many operations."""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
import types

from . import _common as C

OPS = {"full": 10**6, "quick": 10**5}
# (op, api, group, shape): a training loop's mix; one op in ten on a second group, as with a data-parallel subgroup.
MIX = (
    ("all_reduce", "all_reduce", "0", (1024,)),
    ("barrier", "barrier", "0", ()),
    ("broadcast", "_broadcast_coalesced", "0", (16,)),
    ("all_reduce", "all_reduce", "0", (1,)),
    ("all_gather", "all_gather", "0", (8,)),
    ("all_reduce", "all_reduce", "0", (1024,)),
    ("barrier", "barrier", "0", ()),
    ("broadcast", "broadcast", "0", (1,)),
    ("all_reduce", "all_reduce", "0", (1,)),
    ("all_reduce", "all_reduce", "1", (256,)),
)


class FakeTensor:
    """What the recorder reads from a tensor: .shape (a torch.Size, as a real tensor has) and .dtype."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape):
        import torch

        self.shape, self.dtype = torch.Size(shape), torch.float32


def caches_full_at() -> int:
    """Ops after which the code caches have reached their bound (CODE_LIMIT new code objects, one per step, twice)."""
    from ddpwatch.capture.sites import CODE_LIMIT

    return 2 * CODE_LIMIT * len(MIX)


def checkpoints(total: int, ring_size: int) -> list:
    marks = {1, ring_size, min(caches_full_at(), total), total}
    marks.update(10**k for k in range(3, 8) if 10**k < total)
    return sorted(marks)


def one_step(recorder, ops: list) -> None:
    """The collectives of one training step, issued from this function's frame (the user's line)."""
    from ddpwatch.capture.record import tensor_meta

    frame = sys._getframe()
    for op, api, group, tensor in ops:
        recorder.finish(recorder.begin(op, api, group, tensor_meta(tensor), frame))


def new_step_function(number: int):
    """one_step as a new code object: code generated per step (exec'd, compiled) must not grow the recorder."""
    return types.FunctionType(one_step.__code__.replace(co_name=f"step_{number}"), one_step.__globals__)


def drive(recorder, total: int, marks: list, measure) -> list:
    """begin/finish `total` ops the way the patch layer does, a step of len(MIX) ops at a time, each step from a new
    code object; call measure() at each checkpoint."""
    tensors = [(op, api, group, FakeTensor(shape)) for op, api, group, shape in MIX]
    found, done, steps = [], 0, 0
    for mark in marks:
        while done < mark:
            ops = tensors[: min(len(tensors), mark - done)]
            new_step_function(steps)(recorder, ops)
            done, steps = done + len(ops), steps + 1
        found.append((mark, measure()))
    return found


def traced(ring_size: int, total: int) -> list:
    """tracemalloc's count of what the Recorder holds (every Python allocation made since it was created)."""
    from ddpwatch.capture.record import Recorder

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        recorder = Recorder(ring_size)

        def held():
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - base

        return drive(recorder, total, checkpoints(total, ring_size), held) + [("recorder", recorder)]
    finally:
        tracemalloc.stop()


def timed(ring_size: int, total: int) -> tuple:
    """Without tracemalloc: microseconds per begin+finish pair (thread CPU time), and the process RSS."""
    import psutil

    from ddpwatch.capture.record import Recorder

    process = psutil.Process()
    recorder = Recorder(ring_size)
    start_rss, start_cpu = process.memory_info().rss, time.thread_time()
    marks = drive(recorder, total, checkpoints(total, ring_size), lambda: process.memory_info().rss - start_rss)
    return (time.thread_time() - start_cpu) / total * 1e6, marks


def snapshot_sizes(recorder) -> dict:
    """Bytes of this rank's JSON in the store: a heartbeat (8 recent records) and an incident answer (64)."""
    from ddpwatch.format import documents

    return {recent: len(documents.dumps(recorder.snapshot(recent=recent))) for recent in (8, 64)}


def main(argv=None) -> None:
    opts = C.parser(__doc__).parse_args(argv)
    from ddpwatch.capture import sites
    from ddpwatch.config import Config

    mode = "quick" if opts.quick else "full"
    C.header("memory: the recorder's footprint per rank", opts.quick)
    ring_size, total = Config().ring_size, OPS[mode]
    traced_marks = traced(ring_size, total)
    recorder = traced_marks.pop()[1]
    per_op_us, rss_marks = timed(ring_size, total)
    ring_full = dict(traced_marks)[ring_size]
    rows = [
        [f"{ops:,}", f"{held / 1024:.1f}", f"{rss / 1024:.0f}"]
        for (ops, held), (_, rss) in zip(traced_marks, rss_marks)
    ]
    C.print_table(
        f"Recorder(ring_size={ring_size}) driven through Recorder.begin/finish with fake tensors "
        f"({len(MIX)}-op mix, 2 groups)",
        ["ops recorded", "held by the recorder, tracemalloc (KiB)", "process RSS growth (KiB)"],
        rows,
    )
    growth = traced_marks[-1][1] - ring_full
    full_at = min(caches_full_at(), total)
    # The code caches fill to their bound and are emptied, a saw-tooth: compare with its highest tooth so far.
    highest = max(held for ops, held in traced_marks if ring_size <= ops <= full_at)
    growth_when_full = traced_marks[-1][1] - highest
    sizes = snapshot_sizes(recorder)
    C.print_table(
        "Summary",
        ["measure", "value"],
        [
            ["footprint at the default ring size (KiB)", f"{ring_full / 1024:.1f}"],
            ["bytes per record (footprint / ring size)", f"{ring_full / ring_size:.0f}"],
            [f"growth from a full ring to {total:,} ops (KiB)", f"{growth / 1024:.1f}"],
            [
                f"growth from the most held up to full code caches ({full_at:,} ops) to {total:,} ops (KiB)",
                f"{growth_when_full / 1024:.1f}",
            ],
            ["bounded", "yes" if growth_when_full < 0.05 * ring_full else "NO"],
            ["records in the ring / in flight at the end", f"{len(recorder.ring)} / {len(recorder.inflight)}"],
            ["begin + finish, thread CPU time (us per op, no tracemalloc)", f"{per_op_us:.2f}"],
            ["heartbeat JSON per rank (bytes, 8 recent records)", sizes[8]],
            ["incident answer JSON without stacks (bytes, 64 recent)", sizes[64]],
            ["code objects in sites.py's frame-kind cache (one new code object per step)", len(sites.kind_of_code)],
            [
                "code objects kept for raw sites (bound: sites.CODE_LIMIT)",
                f"{len(sites._code_by_id)} (<= {sites.CODE_LIMIT})",
            ],
        ],
    )


if __name__ == "__main__":
    main()
