"""Ranks grouped into nodes of 2 on this host (issue 45's node relay): `python nodes.py CASE`.

Each rank says it is on node rank // 2 (GROUP_RANK and LOCAL_WORLD_SIZE, as torchrun's agent sets them), so a job of
4 ranks spans 2 nodes and their running ranks reach the store through their node's leader (watch/node.py).

leader_stops: 4 ranks train together for a few seconds; then rank 2, its node's leader, stops (SIGSTOP); rank 3,
on the same node, computes outside collectives for a long time (a straggler); ranks 0 and 1 wait in an
all_reduce. Rank 2 must be reported unresponsive, and rank 3, whose running beats went through rank 2, must still be
seen: the node's next rank leads, reads the incident and answers it.
healthy: the same 4 ranks train for a few seconds and end: no report.
"""

import os
import signal
import sys
import time

LOCAL = 2


def main():
    case = sys.argv[1]
    rank = int(os.environ["RANK"])
    os.environ.update(GROUP_RANK=str(rank // LOCAL), LOCAL_WORLD_SIZE=str(LOCAL), LOCAL_RANK=str(rank % LOCAL))
    import torch
    import torch.distributed as dist

    import ddpwatch

    torch.set_num_threads(1)
    with ddpwatch.guard():
        dist.init_process_group("gloo")
        for _ in range(150):  # every rank runs for a few rounds (interval 0.5 s): the relay carries every running beat
            dist.all_reduce(torch.ones(8))
            time.sleep(0.01)
        dist.barrier()
        if case == "leader_stops":
            if rank == 2:
                os.kill(os.getpid(), signal.SIGSTOP)  # LINE:stopped
            elif rank == 3:
                end = time.monotonic() + 120
                while time.monotonic() < end:
                    sum(range(1000))  # LINE:straggling
            print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
            dist.all_reduce(torch.ones(8))  # LINE:waiting
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
