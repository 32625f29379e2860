"""PyTorch 'Writing Distributed Applications' tutorial: a ring all-reduce written with isend/recv; correct."""

EXPECT = {
    "source": "https://docs.pytorch.org/tutorials/_sources/intermediate/dist_tuto.rst.txt",
    "summary": "The tutorial's own allreduce(send, recv) implements a ring reduction: for size - 1 rounds each rank "
    "isends a buffer to (rank + 1) % size, blocks in recv from (rank - 1) % size, accumulates, and "
    "alternates the two buffers, waiting on its isend at the end of the round. Every rank both sends "
    "and receives once per round, so the ring never stalls; three ranks make a real ring.",
    "family": "benign",
    "world_size": 3,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import time

import torch
import torch.distributed as dist


def ring_allreduce(send, recv):
    rank, size = dist.get_rank(), dist.get_world_size()
    send_buff = send.clone()
    recv_buff = torch.zeros_like(send)
    accum = send.clone()
    left = ((rank - 1) + size) % size
    right = (rank + 1) % size
    for i in range(size - 1):
        if i % 2 == 0:
            send_req = dist.isend(send_buff, right)  # send send_buff
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            send_req = dist.isend(recv_buff, right)  # send recv_buff
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    results = []
    for _ in range(4):
        t = torch.randn(6)
        out = torch.zeros_like(t)
        ring_allreduce(t, out)
        check = t.clone()
        dist.all_reduce(check)
        results.append((round(out.sum().item(), 4), bool(torch.allclose(out, check, atol=1e-5))))
    print(f"[rank{rank}] ring sums and match with all_reduce {results}", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
