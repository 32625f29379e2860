"""bo-ke/llm-internal-medicine#45: a metrics helper returns early on a stage with no monitored layer."""

EXPECT = {
    "source": "https://github.com/bo-ke/llm-internal-medicine/pull/45",
    "summary": "'keep gather_and_aggregate collective on ranks with no metrics': gather_and_aggregate returned "
               "early when the local metric dict was empty, skipping all_gather_object; a pipeline stage can hold "
               "no monitored layer (only the LM head), and then every other rank blocks in the gather - a "
               "13-minute hang at PP=4 (distilled: a hand-written two-stage pipeline whose last stage holds only "
               "the head).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [1],
    "line": "empty_metrics_return",
    "fix": ["all_reduce", "broadcast", "every rank"],
}

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

HIDDEN = 16
LOG_EVERY = 2


def mark():
    # Printed before every blocking call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


class ActivationMonitor:
    """Records the RMS of every monitored layer's output on this rank."""

    def __init__(self, module, pattern=("attn", "mlp")):
        self.values = {}
        for name, layer in module.named_modules():
            if any(part in name for part in pattern):
                layer.register_forward_hook(self._hook(name))

    def _hook(self, name):
        def record(layer, inputs, output):
            self.values[name] = output.detach().pow(2).mean().sqrt().item()
        return record


def gather_and_aggregate(local_metrics):
    if not local_metrics:
        return {}  # LINE:empty_metrics_return
    gathered = [None] * dist.get_world_size()
    mark()
    dist.all_gather_object(gathered, local_metrics)
    return {key: value for part in gathered for key, value in part.items()}


def build_stage(rank):
    if rank == 0:
        return nn.ModuleDict({"attn": nn.Linear(HIDDEN, HIDDEN), "mlp": nn.Linear(HIDDEN, HIDDEN)})
    return nn.ModuleDict({"lm_head": nn.Linear(HIDDEN, 4)})  # the last stage holds no monitored layer


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    stage = build_stage(rank)
    monitor = ActivationMonitor(stage)
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)
    for step in range(20):
        x = torch.randn(8, HIDDEN, generator=generator)
        y = torch.randint(0, 4, (8,), generator=generator)
        if rank == 0:
            hidden = stage["mlp"](torch.relu(stage["attn"](x)))
            mark()
            dist.send(hidden.detach(), dst=1)
            grad = torch.empty_like(hidden)
            dist.recv(grad, src=1)
            hidden.backward(grad)
        else:
            hidden = torch.empty(8, HIDDEN)
            mark()
            dist.recv(hidden, src=0)
            hidden.requires_grad_()
            nn.functional.cross_entropy(stage["lm_head"](hidden), y).backward()
            dist.send(hidden.grad, dst=0)
        optimizer.step()
        optimizer.zero_grad()
        if step % LOG_EVERY == LOG_EVERY - 1:
            stats = gather_and_aggregate(monitor.values)
            if rank == 0:
                print(f"step {step}: {stats}", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
