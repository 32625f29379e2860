"""huggingface/transformers#29980: saving runs the sharded prompt encoder on rank 0 only (ZeRO-3 -> FSDP2 here)."""

EXPECT = {
    "source": "https://github.com/huggingface/transformers/pull/29980",
    "summary": "'fix prompt tuning + deepspeed zero3 + checkpoint_saving hang': prompt tuning's save_pretrained "
               "runs the prompt_encoder forward, and only rank 0 calls it under ZeRO-3, whose forward gathers the "
               "sharded parameters from every rank: training hangs after saving (distilled with FSDP2's "
               "fully_shard, which all-gathers in forward the same way).",
    "family": "collective",
    "world_size": 2,
    "kind": "collective_on_subset",
    "ranks": [0],
    "line": "prompt_forward",
    "fix": ["every rank", "all ranks"],
}

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def mark():
    # Printed before every collective-bearing call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class PromptEncoder(nn.Module):
    def __init__(self, virtual_tokens=8, dim=16):
        super().__init__()
        self.embedding = nn.Embedding(virtual_tokens, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))

    def forward(self, indices):
        return self.mlp(self.embedding(indices))


def save_pretrained(prompt_encoder, directory):
    # As PEFT does for prompt tuning: the saved prompt is the encoder's output, so saving runs its forward.
    with torch.no_grad():
        prompt = prompt_encoder(torch.arange(8))  # LINE:prompt_forward
    torch.save({"prompt_embeddings": prompt}, os.path.join(directory, "adapter_model.bin"))


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    prompt_encoder = PromptEncoder()
    for module in (prompt_encoder.embedding, prompt_encoder.mlp):  # as ZeRO-3 partitions every layer
        fully_shard(module)
    fully_shard(prompt_encoder)
    optimizer = torch.optim.SGD(prompt_encoder.parameters(), lr=0.01)
    for step in range(4):
        mark()
        prompt_encoder(torch.randint(0, 8, (4,))).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 1:  # checkpointing: the main process saves, every process waits for it
            if dist.get_rank() == 0:
                mark()
                save_pretrained(prompt_encoder, tempfile.mkdtemp(prefix="corpus-36-"))
            mark()
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
