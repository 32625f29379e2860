"""A job that hangs in its first attempt only: under torchrun --max-restarts, attempt 0 (TORCHELASTIC_RESTART_COUNT)
has rank 0 alone call all_reduce; the restarted attempt runs every collective on every rank and finishes.
No ddpwatch import: run it under DDPWATCH=1 or `ddpwatch run`."""

import os
import sys

import torch
import torch.distributed as dist


def main():
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(3):
        dist.all_reduce(torch.ones(1))
    if attempt == 0 and rank == 0:
        dist.all_reduce(torch.ones(1))  # the first attempt's bug: rank 0 alone  # LINE:restart_subset
    dist.barrier()
    dist.destroy_process_group()
    print(f"RESTART-ONCE rank {rank} finished attempt {attempt}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
