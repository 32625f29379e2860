"""Instructions per collective added by the guard's wrapper, counted by valgrind: a figure noise cannot move.

Wall and CPU time on a shared 2-core machine move by 30% between runs; instruction counts do not. The wrapper is
built by the real Patcher around a do-nothing collective with all_reduce's signature, so only ddpwatch's own work is
counted (no torch, no backend). Each case runs N and 2N times under callgrind; the difference divided by N is the
cost of one call, start-up and first-call costs cancelling out.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from . import _common as C

CASES = {
    "bare call (the collective alone)": "bare",
    "guarded call (wrapper + record)": "wrapped",
    "Recorder.begin + finish_returned": "record",
    "wrapper without recording (group not ours)": "not_member",
}
CALLS = {"full": 20000, "quick": 2000}


def worker(case: str, calls: int) -> None:
    """Run one case `calls` times (inside valgrind); torch is replaced by a stand-in so nothing else is counted."""
    import types
    import weakref

    class Tensor:
        shape = (1,)
        dtype = "float32"

    sys.modules["torch"] = types.SimpleNamespace(Tensor=Tensor)  # the wrapper's plain-tensor test uses torch.Tensor
    from ddpwatch.capture.wrappers import Patcher
    from ddpwatch.capture.record import Recorder

    class Group:
        pass

    class World:  # torch's _World: default_pg is a property over _default_pg
        def __init__(self, pg):
            self._default_pg, self.pg_coalesce_state = pg, {}

        @property
        def default_pg(self):
            return self._default_pg

    group, tensor, recorder = Group(), Tensor(), Recorder()
    patcher = Patcher(recorder)
    patcher._c10d = types.SimpleNamespace(_world=World(group))
    patcher._group_cache[id(group)] = (weakref.ref(group), "" if case == "not_member" else "0", True)
    recorder.note_group("0", None, True)

    def all_reduce(tensor, op=None, group=None, async_op=False):
        return None

    wrapped = patcher._collective_wrapper(all_reduce, "all_reduce", "all_reduce", ("tensor",))
    caller = sys._getframe()
    if case == "bare":
        for _ in range(calls):
            all_reduce(tensor)
    elif case == "record":
        finish = getattr(recorder, "finish_returned", recorder.finish)  # older ddpwatch: finish() only
        for _ in range(calls):
            finish(recorder.begin("all_reduce", "all_reduce", "0", (), caller))
    else:
        for _ in range(calls):
            wrapped(tensor)


def count(case: str, calls: int) -> int:
    """Instructions the whole process executed for `calls` calls of `case`, from callgrind's summary."""
    return C.callgrind_instructions(["benchmarks.hot_path_instructions", "--worker", case, str(calls)], timeout=600)


def main(argv=None) -> None:
    args = C.parser(__doc__)
    args.add_argument("--worker", nargs=2, metavar=("CASE", "CALLS"), help=argparse.SUPPRESS)
    opts = args.parse_args(argv)
    if opts.worker:
        worker(opts.worker[0], int(opts.worker[1]))
        return
    mode = "quick" if opts.quick else "full"
    C.header("hot_path_instructions: instructions per collective (valgrind)", opts.quick)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured (apt-get install valgrind)")
        return
    n = CALLS[mode]
    per_call = {label: (count(case, 2 * n) - count(case, n)) / n for label, case in CASES.items()}
    bare = per_call["bare call (the collective alone)"]
    rows = [
        [label, round(value), round(value - bare) if label != "bare call (the collective alone)" else "-"]
        for label, value in per_call.items()
    ]
    C.print_table(
        f"Instructions per call, (I(2N) - I(N)) / N with N = {n}, Python {sys.version.split()[0]}",
        ["case", "instructions per call", "added over the bare call"],
        rows,
    )


if __name__ == "__main__":
    main()
