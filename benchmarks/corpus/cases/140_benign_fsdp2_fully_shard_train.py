"""pytorch/examples FSDP2 example: fully_shard per layer then the root, a few training steps; correct."""

EXPECT = {
    "source": "https://github.com/pytorch/examples/blob/main/distributed/FSDP2/example.py",
    "summary": "The FSDP2 example builds a Transformer, calls fully_shard on every layer and then on the root, and "
    "trains with loss.backward, clip_grad_norm_ and Adam for a few steps. Every rank runs the same "
    "forward/backward, so FSDP2's per-layer all-gathers and reduce-scatters (and the grad-norm all-reduce) "
    "line up in the same order on all ranks: a correct program.",
    "family": "benign",
    "world_size": 2,
    "kind": None,
    "ranks": None,
    "line": None,
    "fix": [],
}

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Model(nn.Module):
    def __init__(self, vocab=64, width=16, n_layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([Block(width) for _ in range(n_layers)])
        self.out = nn.Linear(width, vocab)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Model()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for step in range(5):
        tokens = torch.randint(0, 64, (4, 8), generator=gen)
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
        print(f"[rank{rank}] step {step} loss {loss.item():.4f} grad_norm {norm.full_tensor().item():.4f}")
    local = sum(p.to_local().double().sum().item() for p in model.parameters())
    print(f"[rank{rank}] local shard checksum {local:.4f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
