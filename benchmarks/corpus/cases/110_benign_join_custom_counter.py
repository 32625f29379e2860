"""pytorch/tutorials generic_join: a custom Joinable Counter (all-reduce per input) with uneven counts; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/tutorials/blob/0e3158bae11a9a55a0b129bb6cc02de9481d9c48/advanced_source/generic_join.rst",
    "summary": "The Join tutorial's toy Joinable: Counter all-reduces a one per call after "
    "Join.notify_join_context(); its JoinHook's main_hook shadows that all-reduce with a zero while other "
    "ranks still run, and its post_hook broadcasts the final count from the last joiner (found with a MAX "
    "all-reduce). A correct program: rank 0 sees 5 inputs, rank 1 sees 8; rank 0 counts 10 before joining, "
    "rank 1 counts 13, and both agree the maximum is 13.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook


class CounterJoinHook(JoinHook):
    """Join hook for Counter: shadows the per-input all-reduce, optionally syncs the max count at the end."""

    def __init__(self, counter, sync_max_count):
        self.counter = counter
        self.sync_max_count = sync_max_count

    def main_hook(self):
        t = torch.zeros(1, device=self.counter.device)
        dist.all_reduce(t)

    def post_hook(self, is_last_joiner: bool):
        if not self.sync_max_count:
            return
        rank = dist.get_rank(self.counter.process_group)
        common_rank = self.counter.find_common_rank(rank, is_last_joiner)
        if rank == common_rank:
            self.counter.max_count = self.counter.count.detach().clone()
        dist.broadcast(self.counter.max_count, src=common_rank)


class Counter(Joinable):
    """Counts the inputs processed by all ranks, one all-reduce per call."""

    def __init__(self, device, process_group):
        super().__init__()
        self.device = device
        self.process_group = process_group
        self.count = torch.tensor([0], device=device).float()
        self.max_count = torch.tensor([0], device=device).float()

    def __call__(self):
        Join.notify_join_context(self)
        t = torch.ones(1, device=self.device).float()
        dist.all_reduce(t)
        self.count += t

    def join_hook(self, **kwargs) -> JoinHook:
        sync_max_count = kwargs.get("sync_max_count", False)
        return CounterJoinHook(self, sync_max_count)

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self):
        return self.process_group

    def find_common_rank(self, rank, to_consider):
        common_rank = torch.tensor([rank if to_consider else -1], device=self.device)
        dist.all_reduce(common_rank, op=dist.ReduceOp.MAX, group=self.process_group)
        return common_rank.item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    counter = Counter(torch.device("cpu"), dist.group.WORLD)
    inputs = [torch.tensor([1]).float() for _ in range(5 + 3 * rank)]
    with Join([counter], sync_max_count=True):
        for _ in inputs:
            counter()
    print(f"[rank{rank}] {int(counter.count.item())} inputs processed before rank {rank} joined", flush=True)
    print(f"[rank{rank}] {int(counter.max_count.item())} inputs processed across all ranks", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
