"""torch distributed_test scatter/gather helpers: each rank in turn is root of a scatter and a gather; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/blob/a069159c00b60fc660b36e63b9863cb6b30cda16/torch/testing/_internal/distributed/distributed_test.py",  # noqa: E501
    "summary": "PyTorch's distributed tests (_test_scatter_helper, _test_gather_helper) loop `for dest in group`: "
    "the root builds the scatter_list / gather_list and the other ranks pass an empty list, and all "
    "ranks call scatter(src=dest) and gather(dst=dest) with the same root. The root rotates, but every "
    "rank walks the same root sequence, so each collective is matched.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    results = []
    for step in range(2):
        for dest in range(world):
            # scatter from the rotating root: only the root provides the list
            chunk = torch.empty(dest + 2)
            if rank == dest:
                pieces = [torch.full((dest + 2,), float(10 * step + i)) for i in range(world)]
                dist.scatter(chunk, scatter_list=pieces, src=dest)
            else:
                dist.scatter(chunk, scatter_list=[], src=dest)
            local = chunk * (rank + 1) + torch.randn(dest + 2)
            # gather back to the same root
            if rank == dest:
                gathered = [torch.empty(dest + 2) for _ in range(world)]
                dist.gather(local, gather_list=gathered, dst=dest)
                results.append(round(torch.stack(gathered).sum().item(), 4))
            else:
                dist.gather(local, gather_list=[], dst=dest)
    print(f"[rank{rank}] gathered sums as root {results}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
