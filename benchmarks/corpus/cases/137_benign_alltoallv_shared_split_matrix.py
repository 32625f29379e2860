"""torch_ucc alltoallv test: splits from one seeded matrix known to all ranks, uneven all_to_all_single; correct."""

EXPECT = {
    "source": "https://github.com/facebookresearch/torch_ucc/blob/37301c8abc44c6c4fe26ffc1bb9e6ca442096d3c/test/torch_alltoallv_test.py",  # noqa: E501
    "summary": "The torch_ucc alltoallv test seeds numpy identically on every rank, draws a size x size split "
    "matrix, and calls all_to_all_single(recv, send, split[:, rank], split[rank, :]) for growing "
    "counts: each rank's input and output split sizes differ, but because every rank derived them "
    "from the same matrix the sizes agree pairwise without exchanging counts first.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import time

import numpy as np
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    size, rank = dist.get_world_size(), dist.get_rank()
    results = []
    for count in [16, 64, 256, 1024]:
        np.random.seed(3131)  # the same split matrix on every rank
        split = np.random.randint(low=1, high=2 * count // size, size=(size, size))
        input_size = split.sum(axis=1)
        output_size = split.sum(axis=0)
        send = torch.arange(int(input_size[rank]), dtype=torch.float32) + 1000 * rank
        recv = torch.empty(int(output_size[rank]))
        dist.all_to_all_single(recv, send, split[:, rank].tolist(), split[rank, :].tolist())
        status = torch.tensor([float(recv.numel() == output_size[rank])])
        dist.all_reduce(status)
        results.append((int(input_size[rank]), int(output_size[rank]), round(recv.sum().item(), 1), int(status.item())))
    print(f"[rank{rank}] (in, out, recv sum, ranks ok) {results}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
