"""Ranks grouped into nodes on this host (issue 45's node relay): `python nodes.py CASE`.

Each rank says which node it is on (GROUP_RANK, LOCAL_WORLD_SIZE, LOCAL_RANK, as torchrun's agent sets them), by
the case's layout, so that the running ranks of a node of several reach the store through their node's leader
(watch/node.py).

leader_stops (3 ranks: node 0 = rank 0, node 1 = ranks 1 and 2): they train together for a few rounds; then rank 1,
node 1's leader, stops (SIGSTOP); rank 2, on the same node, computes outside collectives for a long time (a
straggler); rank 0 waits in an all_reduce. Rank 1 must be reported unresponsive, and rank 2, whose running beats
went through rank 1, must still be seen: the node's next rank leads, reads the incident and answers it.
healthy (2 ranks, one node; the test turns the relay on): they train for a few rounds and end: no report.
node_waits (3 ranks, as leader_stops): rank 0 sleeps outside collectives (a straggler), ranks 1 and 2 wait in an
all_reduce for it, both blocked on one node: after the first round that says so, their beats reach the store through
rank 1, their node's leader, which carries them at its looks. The straggler must be reported after the timeout, with
both waiting ranks seen live (never silent) the whole time.
"""

import os
import signal
import sys
import time

LAYOUT = {"leader_stops": ([0], [1, 2]), "healthy": ([0, 1],), "node_waits": ([0], [1, 2])}


def main():
    case = sys.argv[1]
    rank = int(os.environ["RANK"])
    node, members = next((i, ranks) for i, ranks in enumerate(LAYOUT[case]) if rank in ranks)
    os.environ.update(GROUP_RANK=str(node), LOCAL_WORLD_SIZE=str(len(members)), LOCAL_RANK=str(members.index(rank)))
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
            if rank == 1:
                os.kill(os.getpid(), signal.SIGSTOP)  # LINE:stopped
            elif rank == 2:
                end = time.monotonic() + 120
                while time.monotonic() < end:
                    sum(range(1000))  # LINE:straggling
        elif case == "node_waits" and rank == 0:
            time.sleep(120)  # LINE:sleeping
        if case != "healthy":
            print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
            dist.all_reduce(torch.ones(8))  # LINE:waiting
        dist.destroy_process_group()
    print("rank finished cleanly", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
