"""hpc/mpifileutils#26: rank 0 receives from every rank, but a rank with nothing to report sends nothing."""

EXPECT = {
    "source": "https://github.com/hpc/mpifileutils/pull/26",
    "summary": "'Build the actual list of ranks to receive work from in dcp2': the receiver assumed every rank in "
               "a sequential range sends to it, but 'the list of ranks sending us work is not necessarily "
               "sequential, treating it as such leads to hung processes awaiting messages that will never be "
               "sent' (an MPI tool; distilled to torch.distributed: a data check where rank 0 loops over "
               "dist.recv(src=r) for every rank r, and a rank whose shard has no bad record returns without "
               "sending).",
    "family": "p2p",
    "world_size": 3,
    "kind": "p2p_deadlock",
    "ranks": [2],
    "line": "no_errors_return",
    "fix": ["zero", "always send", "same number", "matching"],
}

import sys
import time

import torch
import torch.distributed as dist


def mark():
    # Printed before every blocking call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def check_shard(rank):
    # Indices of the records in this rank's shard that fail validation (non-finite features).
    generator = torch.Generator().manual_seed(rank)
    records = torch.randn(100, 4, generator=generator)
    if rank == 1:
        records[[7, 42]] = float("nan")
    return torch.nonzero(~records.isfinite().all(1)).flatten()


def report_errors(bad):
    if dist.get_rank() != 0:
        if bad.numel() == 0:
            return None  # LINE:no_errors_return
        mark()
        dist.send(torch.tensor([bad.numel()]), dst=0)
        dist.send(bad, dst=0)
        return None
    report = {}
    for source in range(1, dist.get_world_size()):
        count = torch.zeros(1, dtype=torch.long)
        mark()
        dist.recv(count, src=source)
        indices = torch.empty(int(count.item()), dtype=torch.long)
        dist.recv(indices, src=source)
        report[source] = indices.tolist()
    return report


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = report_errors(check_shard(rank))
    if rank == 0:
        print(f"bad records per rank: {report}", file=sys.stderr, flush=True)
    mark()
    dist.barrier()  # everyone waits for the report before training starts
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
