"""pytorch/pytorch#56112: all_gather of different lengths per rank blocks on GPUs; gloo aborts on the size check."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/issues/56112",
    "summary": "'torch.distributed.all_gather cannot gather variable length tensors?': all_gather of token "
               "indices cut to each rank's own max_len is blocked; the author found each GPU had a different "
               "length.",
    "family": "collective",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
    "gloo_note": "On gloo the all_gather does not wait: the receiving side checks the message size and the "
                 "process aborts with 'Received data size doesn't match expected size' (gloo::EnforceNotMet); "
                 "an empty tensor on one rank is the gloo form of this hang (ddpwatch's shape_mismatch).",
}

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    valid_len = torch.tensor([5, 7]) if rank == 0 else torch.tensor([3, 4])
    query_idx = torch.arange(32).reshape(2, 16)[:, :max(valid_len).item()].contiguous()
    gathered = [torch.empty_like(query_idx) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, query_idx)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
