"""Instructions the guard adds per real collective, gloo against torch's fake process group, counted by valgrind.

Issue 44 asks where the gloo-only part of the per-op cost goes: docs/performance.md measured 1.75-1.99 us added per
collective on the fake process group and 10-29 us of calling-thread CPU on real gloo ops. Time on this shared 2-core
machine moves by tens of percent; instruction counts do not. Each case is one process under callgrind: real torch,
one rank (gloo on a HashStore, world size 1; or the fake backend, world size 4), the python recorder's patches
installed by the real Patcher, or not (no watchdog thread: only the calling thread's work and gloo's own threads,
the same in both arms). Each case runs N and 2N all_reduce calls of one element; (I(2N) - I(N)) / N is one call,
start-up cancelling out. If the guard adds as many instructions on gloo as on the fake pg, the gloo gap is in how
fast they run (caches refilled after every blocking wait), not in extra work.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from . import _common as C

CALLS = {"full": 4000, "quick": 400}
CASES = (("fake", False), ("fake", True), ("gloo", False), ("gloo", True))


def worker(backend: str, guarded: bool, calls: int) -> None:
    """`calls` all_reduce calls of one element on `backend`, the python recorder's patches on or off."""
    import torch
    import torch.distributed as dist

    if backend == "fake":
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers the "fake" backend

        dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=4)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    patcher = None
    if guarded:
        from ddpwatch.capture.record import Recorder
        from ddpwatch.capture.wrappers import Patcher

        patcher = Patcher(Recorder())
        patcher.patch(per_op=True)
    tensor = torch.ones(1)
    for _ in range(calls):
        dist.all_reduce(tensor)
    if patcher is not None:
        patcher.unpatch()
    dist.destroy_process_group()


def count(backend: str, guarded: bool, calls: int) -> int:
    """Instructions the whole process executed (every thread) for `calls` calls, from callgrind's summary."""
    worker = ["benchmarks.op_instructions", "--worker", backend, "1" if guarded else "0", str(calls)]
    return C.callgrind_instructions(worker, timeout=1200, OMP_NUM_THREADS="1")


def main(argv=None) -> None:
    args = C.parser(__doc__)
    args.add_argument("--worker", nargs=3, metavar=("BACKEND", "GUARDED", "CALLS"), help=argparse.SUPPRESS)
    opts = args.parse_args(argv)
    if opts.worker:
        worker(opts.worker[0], opts.worker[1] == "1", int(opts.worker[2]))
        return
    mode = "quick" if opts.quick else "full"
    C.header("op_instructions: instructions per real collective, guarded and not, gloo and fake pg", opts.quick)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: nothing measured (apt-get install valgrind)")
    n = CALLS[mode]
    per_call = {
        (backend, guarded): (count(backend, guarded, 2 * n) - count(backend, guarded, n)) / n
        for backend, guarded in CASES
    }
    rows = []
    for backend in ("fake", "gloo"):
        plain, armed = per_call[(backend, False)], per_call[(backend, True)]
        rows.append([backend, round(plain), round(armed), round(armed - plain)])
    C.print_table(
        f"Instructions per all_reduce of 1 element, every thread, (I(2N) - I(N)) / N with N = {n}, "
        f"Python {sys.version.split()[0]}",
        ["backend", "unguarded", "guarded (python recorder's patches)", "added by the guard"],
        rows,
    )


if __name__ == "__main__":
    main()
