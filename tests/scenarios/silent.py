"""Collectives that complete without matching, and correct programs that look like them: `python silent.py CASE`.

Lines tagged `# LINE:name`. Each case ends with a few seconds of work outside collectives (the watchdog's rounds
compare the ranks' published positions meanwhile), then every rank checks out through a barrier.
"""

import glob
import importlib
import logging
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import ddpwatch

SETTLE_S = 3.5  # enough for two watchdog rounds (interval 1 s) after the last position
# crossed_every_step: each phase of its loop, several watchdog rounds; the crossed phase goes on until a report is
# written and LOOP_S more (the same lines at later positions: one report, not one a round), at most CROSS_MAX_S (the
# flight recorder samples a fast job every 200-400 times a read's cost: tens of seconds on a loaded machine)
LOOP_S = float(os.environ.get("SILENT_LOOP_S", "3.0"))
REPORTS = os.path.join(os.environ.get("DDPWATCH_DIR", "."), "*", "report.json")
CROSS_MAX_S = float(os.environ.get("SILENT_CROSS_MAX_S", "20"))


def mark():
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def warm_up():
    for _ in range(3):
        dist.all_reduce(torch.ones(2))


def float_against_int(rank, world):
    """A counter kept as int32 on one rank, float32 on the others: 4 int32 against 4 float32, the same bytes."""
    warm_up()
    total = torch.tensor([1, 2, 3, 4], dtype=torch.int32 if rank == 1 else torch.float32)
    mark()
    dist.all_reduce(total)  # LINE:dtype
    time.sleep(SETTLE_S)


def sync_loss(loss):
    dist.all_reduce(loss)  # LINE:loss


def sync_hist(hist):
    dist.all_reduce(hist)  # LINE:hist


def crossed(rank, world):
    """Metric helpers called in a rank-dependent order (a set's order, a rank-local dict): values swap."""
    warm_up()
    loss, hist = torch.full((1,), 1.0 + rank), torch.full((1,), 100.0 + rank)
    order = [(sync_loss, loss), (sync_hist, hist)]
    if rank % 2:
        order.reverse()
    mark()
    for helper, value in order:
        helper(value)
    time.sleep(SETTLE_S)


def crossed_every_step(rank, world):
    """The crossed helpers inside a training loop: every step of a few watchdog rounds, among metric reductions, some
    rounds in (thousands of collectives a second: more than torch's Flight Recorder keeps between two of its reads)."""
    warm_up()
    loss, hist = torch.full((1,), 1.0 + rank), torch.full((1,), 100.0 + rank)
    started, step, phase, reported = time.monotonic(), 0, torch.zeros(1), [None]  # when rank 0 first saw a report
    while phase.item() < 3:  # 0: in order; 1: crossed on odd ranks; 2: in order again (what stays in the
        # Flight Recorder's buffer at the end holds no crossing: it must be found while it happens); 3: done
        for _ in range(8):
            dist.all_reduce(torch.ones(4))
        order = [(sync_loss, loss), (sync_hist, hist)]
        if rank % 2 and phase.item() == 1:
            order.reverse()
        for helper, value in order:
            helper(value)
        step += 1
        if step % 50 == 0:  # every rank changes phase at the same step: rank 0's clock decides
            before = phase.item()
            if rank == 0 and phase_over(before, time.monotonic() - started, reported):
                phase.fill_(before + 1)
                started = time.monotonic()
            if rank == 0 and before == 1 and reported[0] is None and glob.glob(REPORTS):
                reported[0] = time.monotonic()
            phase.fill_(phase.item() if rank == 0 else 0.0)
            dist.all_reduce(phase)
            if before == 0 and phase.item() == 1:
                mark()
    time.sleep(SETTLE_S)


def phase_over(phase: float, lasted: float, reported: list) -> bool:
    """crossed_every_step's phases: LOOP_S each, but the crossed one (1) lasts until LOOP_S after the first report, or
    CROSS_MAX_S (no report: the test fails on that)."""
    if phase != 1:
        return lasted >= LOOP_S
    return lasted >= CROSS_MAX_S or (reported[0] is not None and time.monotonic() - reported[0] >= LOOP_S)


def reduce_op(rank, world):
    """The reduce op taken from rank-local configuration: SUM on rank 0, MAX elsewhere."""
    warm_up()
    op = dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX
    mark()
    dist.all_reduce(torch.ones(3), op=op)  # LINE:reduce
    time.sleep(SETTLE_S)


def log_loss():
    dist.all_reduce(torch.ones(4))  # LINE:log_loss


def log_hist():
    dist.all_reduce(torch.ones(8))  # LINE:log_hist


def sizes(rank, world):
    """Per-rank logging helpers that reduce different things at one position: gloo aborts the smaller side (rank 1
    here: rank 0 hosts the store without torchrun, and a report needs it)."""
    warm_up()
    mark()
    if rank == 0:
        log_hist()
    else:
        log_loss()
    time.sleep(SETTLE_S)


def log_grad():
    dist.all_reduce(torch.ones(2))  # LINE:log_grad


def sizes_elsewhere(rank, world):
    """`sizes` with rank 1's call at another line: two jobs run together each name their own crash."""
    warm_up()
    mark()
    if rank == 0:
        log_hist()
    else:
        log_grad()
    time.sleep(SETTLE_S)


# ---------------------------------------------------------------- correct programs that must stay silent

def branches(rank, world):
    """Rank 0 broadcasts its tensor from one line, the others receive into theirs from another: correct."""
    for step in range(20):
        if rank == 0:
            dist.broadcast(torch.full((4,), float(step)), src=0)
        else:
            dist.broadcast(torch.zeros(4), src=0)
        dist.all_reduce(torch.ones(2))


def subgroups(rank, world):
    """Even and odd ranks reduce on groups of their own, different things; everyone on the world group too."""
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    odds = dist.new_group([r for r in range(world) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    for step in range(20):
        size = 4 if rank % 2 == 0 else 8
        dist.all_reduce(torch.ones(size), group=mine)
        dist.all_reduce(torch.ones(2))


def threads(rank, world):
    """A side thread reduces on its own group while the main thread reduces on the world group: correct."""
    side = dist.new_group(list(range(world)))

    def worker():
        for _ in range(20):
            dist.all_reduce(torch.ones(8, dtype=torch.float64), group=side)

    thread = threading.Thread(target=worker, name="metrics")
    thread.start()
    for _ in range(20):
        dist.all_reduce(torch.ones(2))
    thread.join()


def uneven_all_to_all(rank, world):
    """all_to_all_single with splits of each rank's own: element counts differ by design."""
    for step in range(5):
        sends = [rank + 1] * world
        receives = [peer + 1 for peer in range(world)]
        out = torch.zeros(sum(receives))
        dist.all_to_all_single(out, torch.ones(sum(sends)), receives, sends)
        dist.all_gather_object([None] * world, {"rank": rank, "note": "x" * (rank * 50)})


def round_robin_roots(rank, world):
    """Each rank shares its shard statistics in turn: the root rotates, the root's branch is another line (issue 40)."""
    mine = torch.full((4,), float(rank))
    for _ in range(3):
        for src in range(world):
            if rank == src:
                dist.broadcast(mine, src)
            else:
                dist.broadcast(torch.zeros(4), src)
    time.sleep(SETTLE_S)


def turn_taking(rank, world):
    """Ranks take turns at a shared resource, a barrier closing each turn, from the turn-holder's line or the
    others' (issue 40)."""
    for _ in range(3):
        for turn in range(world):
            if rank == turn:
                time.sleep(0.01)  # appends to a shared log
                dist.barrier()
            else:
                dist.barrier()
    time.sleep(SETTLE_S)


def join_uneven(rank, world):
    """DDP's join() on uneven per-rank data (torch's documented answer): joined ranks shadow the others'
    all-reduces with collectives of their own (issue 40)."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with model.join():
        for _ in range(5 if rank == 0 else 12):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(0.05)  # a few watchdog rounds while one rank shadows the other
    time.sleep(SETTLE_S)


def benign(rank, world):
    """Every correct look-alike above, one after another: no finding may come of any."""
    warm_up()
    for program in (branches, subgroups, threads, uneven_all_to_all):
        program(rank, world)
    time.sleep(SETTLE_S)


CASES = {name: function for name, function in globals().items()
         if callable(function) and name not in ("mark", "main", "warm_up") and not name.startswith(("_", "sync_", "log_"))
         and getattr(function, "__module__", None) == __name__}


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    if os.environ.get("SILENT_SAY_COMPARED"):  # ddpwatch's DEBUG line saying a comparison covered positions
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(lambda record: "compared" in record.getMessage())
        logging.getLogger("ddpwatch").addHandler(handler)
        logging.getLogger("ddpwatch").setLevel(logging.DEBUG)
    backend = os.environ.get("SILENT_BACKEND", "gloo")
    if backend == "fakenccl":  # NCCL's host-side semantics (tests/nccl_like.py)
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import nccl_like

        nccl_like.register()
    with ddpwatch.guard():
        if backend == "fake":  # torch's fake process group: every op completes at once, nothing checks sizes (as
            # on NCCL, where a size mismatch is not caught either); a real store for ddpwatch to publish in
            importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers "fake"

            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        else:
            dist.init_process_group(backend)
        CASES[case](dist.get_rank(), dist.get_world_size())
        dist.barrier()
        if backend == "fakenccl":
            nccl_like.synchronize()
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
