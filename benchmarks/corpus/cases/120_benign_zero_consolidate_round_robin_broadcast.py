"""torch ZeroRedundancyOptimizer.consolidate_state_dict: every rank broadcasts its optimizer shard in turn; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/pytorch/blob/815ff44c19fa873a2d443df84c4540feecabd44f/torch/distributed/optim/zero_redundancy_optimizer.py",  # noqa: E501
    "summary": "ZeroRedundancyOptimizer shards optimizer state: each rank steps only the parameters it owns and "
    "broadcasts them from the owner, and consolidate_state_dict(to=0) loops over ranks so that each "
    "rank in turn broadcasts its pickled shard (length, then bytes) while the others receive with a "
    "different call site. Every rank walks the same src sequence, so the broadcasts always pair up.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import io
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def broadcast_object(obj, src_rank):
    """Like zero_redundancy_optimizer._broadcast_object: the sender and the receivers take different lines."""
    if dist.get_rank() == src_rank:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        data = bytearray(buffer.getbuffer())
        length = torch.LongTensor([len(data)])
        dist.broadcast(length, src=src_rank)
        dist.broadcast(torch.ByteTensor(data), src=src_rank)
        return obj
    length = torch.LongTensor([0])
    dist.broadcast(length, src=src_rank)
    payload = torch.empty([int(length.item())], dtype=torch.uint8)
    dist.broadcast(payload, src=src_rank)
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    params = list(model.parameters())
    owner = [i % world for i in range(len(params))]  # round-robin partition of the parameters
    mine = [p for p, o in zip(params, owner) if o == rank]
    optimizer = torch.optim.SGD(mine, lr=0.05, momentum=0.9)
    torch.manual_seed(100 + rank)
    for _ in range(4):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in params:  # data-parallel gradient average
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()  # only this rank's shard moves
        for p, o in zip(params, owner):  # _sync_params: each shard broadcast from its owner
            dist.broadcast(p.data, src=o)
    # consolidate_state_dict(to=0): rank by rank, the owner sends its shard and the others receive
    all_states = []
    for src in range(world):
        state = broadcast_object(optimizer.state_dict() if src == rank else None, src_rank=src)
        if rank == 0:
            all_states.append(state)
    checksum = sum(p.detach().sum().item() for p in params)
    print(f"[rank{rank}] params checksum {checksum:.5f}", flush=True)
    if rank == 0:
        sizes = [len(s["state"]) for s in all_states]
        print(f"[rank{rank}] consolidated shards with {sizes} param states", flush=True)
    dist.destroy_process_group()
    time.sleep(0.2)  # let gloo's worker threads free their last Work before the interpreter exits


if __name__ == "__main__":
    main()
