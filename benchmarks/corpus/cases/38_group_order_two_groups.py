"""meta-pytorch/torchrec#4149: two process groups, and the lagging rank issues their collectives in the other order."""

EXPECT = {
    "source": "https://github.com/meta-pytorch/torchrec/pull/4149",
    "summary": "'Different collective execution order across ranks': a production cross-PG deadlock; 62 ranks "
               "scheduled the mesh_shard all_to_all then blocked, while ranks 6/7 were blocked on the "
               "mesh_replicate allreduce first: a circular wait (distilled: 3 ranks, rank 2 is the one whose "
               "order differs).",
    "family": "collective",
    "world_size": 3,
    "kind": "group_order",
    "ranks": [2],
    "line": "replicate_first",
    "fix": ["same order", "order"],
}

import datetime
import sys
import time

import torch
import torch.distributed as dist

GROUP_TIMEOUT = datetime.timedelta(minutes=30)


def mark():
    # Printed before every collective: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh_shard = dist.new_group([0, 1, 2], timeout=GROUP_TIMEOUT)
    mesh_replicate = dist.new_group([0, 1, 2], timeout=GROUP_TIMEOUT)
    for step in range(3):
        embeddings, lengths = torch.empty(6), torch.tensor([5.0, 7.0])
        mark()
        if rank == 2 and step == 1:  # the rank that fell behind needs the padded lengths before its all_to_all
            dist.all_reduce(lengths, group=mesh_replicate)  # LINE:replicate_first
            dist.all_to_all_single(embeddings, torch.arange(6.0), group=mesh_shard)
        else:
            dist.all_to_all_single(embeddings, torch.arange(6.0), group=mesh_shard)
            dist.all_reduce(lengths, group=mesh_replicate)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
