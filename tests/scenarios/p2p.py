"""Real point-to-point hangs and their benign look-alikes: `python p2p.py CASE`; lines tagged `# LINE:name`."""

import sys
import time

import torch
import torch.distributed as dist

import ddpwatch


def mark():
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def send_first(rank, world):
    """A halo exchange written send-then-recv: gloo's send waits for the matching recv."""
    left, right = (rank - 1) % world, (rank + 1) % world
    halo = torch.ones(4)
    mark()
    dist.send(halo, dst=right)  # LINE:send_first
    dist.recv(halo, src=left)


def recv_first(rank, world):
    """Each rank waits on its irecv before it sends."""
    other = 1 - rank
    buf = torch.zeros(4)
    mark()
    request = dist.irecv(buf, src=other)  # LINE:recv_first
    request.wait()  # LINE:recv_wait
    dist.send(torch.ones(4), dst=other)


def wrong_tag(rank, world):
    buf = torch.ones(4)
    mark()
    if rank == 0:
        dist.send(buf, dst=1, tag=7)  # LINE:tag_send
    else:
        dist.recv(buf, src=0, tag=8)  # LINE:tag_recv
    dist.barrier()


def wrong_source(rank, world):
    """Rank 1 waits for rank 2, but it is rank 0 that sends to it; rank 2 goes on to the barrier."""
    buf = torch.ones(4)
    mark()
    if rank == 0:
        dist.send(buf, dst=1)
    elif rank == 1:
        dist.recv(buf, src=2)  # LINE:source_recv
    dist.barrier()


def microbatches(rank, world):
    """A two-stage pipeline whose stages disagree on the number of microbatches: stage 0 runs 4, stage 1 runs 3."""
    count = 4 if rank == 0 else 3
    activation = torch.ones(8)
    for index in range(count):
        if index == count - 1:
            mark()
        if rank == 0:
            dist.send(activation, dst=1)  # LINE:stage_send
        else:
            dist.recv(activation, src=0)
    dist.all_reduce(torch.ones(2))  # LINE:stage_all_reduce


def batch_unpaired(rank, world):
    """batch_isend_irecv lists that do not pair: rank 0 sends and receives, rank 1 only sends."""
    ops = [dist.P2POp(dist.isend, torch.ones(4), 1 - rank)]
    if rank == 0:
        ops.append(dist.P2POp(dist.irecv, torch.zeros(4), 1))
    mark()
    requests = dist.batch_isend_irecv(ops)  # LINE:batch_call
    for request in requests:
        request.wait()  # LINE:batch_wait
    dist.barrier()


def _pipeline(rank, world, schedule, microbatches):
    """torch.distributed.pipelining: one Linear stage per rank, `microbatches[rank]` microbatches on each."""
    from torch.distributed import pipelining

    stage = pipelining.PipelineStage(torch.nn.Linear(8, 8), rank, world, torch.device("cpu"))
    count = microbatches[rank]
    runner = getattr(pipelining, schedule)(stage, n_microbatches=count, loss_fn=lambda out, target: out.sum())
    batch = torch.randn(2 * count, 8)
    mark()  # with different counts the first step hangs
    for _ in range(2):
        if rank == 0:
            runner.step(batch)  # LINE:pipeline_step_first
        else:
            runner.step(target=batch, losses=[])  # LINE:pipeline_step_last
    dist.barrier()


def pipeline_microbatches(rank, world):
    """The stages build their schedules from a rank-local count: 4 microbatches on stage 0, 2 on stage 1."""
    _pipeline(rank, world, "ScheduleGPipe", [4, 2])


# ---------------------------------------------------------------- benign look-alikes: they must finish, unreported

def pipeline_ok(rank, world):
    _pipeline(rank, world, "Schedule1F1B", [4, 4])


def exchange_ok(rank, world):
    """The halo exchange written right: irecv first, then send, then wait; and again with batch_isend_irecv."""
    left, right = (rank - 1) % world, (rank + 1) % world
    for _ in range(20):
        buf = torch.zeros(4)
        request = dist.irecv(buf, src=left)
        dist.send(torch.ones(4), dst=right)
        request.wait()
        ops = [dist.P2POp(dist.isend, torch.ones(4), right), dist.P2POp(dist.irecv, torch.zeros(4), left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    dist.barrier()


def slow_stage(rank, world):
    """Stage 1 computes for 3 s before it sends: stage 0 waits in recv, a straggler at most, never a deadlock."""
    activation = torch.ones(8)
    for _ in range(2):
        if rank == 1:
            time.sleep(3)
            dist.send(activation, dst=0)
        else:
            dist.recv(activation, src=1)
    dist.barrier()


def prefetch(rank, world):
    """Rank 0 posts an irecv, then computes for 3 s before the barrier; rank 1 waits in the barrier, then sends."""
    buf = torch.zeros(4)
    if rank == 0:
        request = dist.irecv(buf, src=1)
        time.sleep(3)
        dist.barrier()
        request.wait()
    else:
        dist.barrier()
        dist.send(torch.ones(4), dst=0)
    dist.barrier()


def _report_errors(errors):
    """Send this rank's error count and the errors to rank 0: none when there are none (the bug)."""
    if not errors:
        return  # LINE:no_errors_return
    dist.send(torch.tensor([len(errors)]), dst=0)  # LINE:errors_send
    dist.send(torch.tensor(errors, dtype=torch.float32), dst=0)


def errors_return(rank, world):
    """A data check: rank 0 receives every other rank's errors in turn; a rank that found none in a round returns
    from its helper without sending (rank 2 finds some in round 0 only), and goes on to the round's barrier."""
    for round_ in range(2):
        if rank == 0:
            for source in range(1, world):
                count = torch.zeros(1, dtype=torch.int64)
                mark()
                dist.recv(count, src=source)  # LINE:errors_recv
                errors = torch.zeros(int(count.item()))
                dist.recv(errors, src=source)
        else:
            errors = [float(rank)] if rank == 1 or round_ == 0 else []
            _report_errors(errors)
        mark()
        dist.barrier()


def _send_kept(items, dst):
    for item in items:
        if item is None:
            continue  # LINE:skip_continue
        dist.send(item, dst=dst)  # LINE:kept_send


def skip_continue(rank, world):
    """Rank 1 sends rank 0 one tensor per item, skipping items it filtered out (the third); rank 0 receives one
    per item, then both all-reduce."""
    if rank == 0:
        for _ in range(3):
            mark()
            dist.recv(torch.zeros(4), src=1)
    else:
        _send_kept([torch.ones(4), torch.ones(4), None], dst=0)
    mark()
    dist.all_reduce(torch.ones(2))


CASES = {name: function for name, function in globals().items()
         if callable(function) and name not in ("mark", "main") and not name.startswith("_")
         and getattr(function, "__module__", None) == __name__}


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    with ddpwatch.guard():
        dist.init_process_group("gloo")
        CASES[case](dist.get_rank(), dist.get_world_size())
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
