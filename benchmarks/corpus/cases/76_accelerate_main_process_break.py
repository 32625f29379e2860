"""huggingface/accelerate#1940: an early-stopping `break` taken on the main process only; the others train on."""

EXPECT = {
    "source": "https://github.com/huggingface/accelerate/pull/1940",
    "summary": "'Introduce breakpoint API' (set_trigger/check_trigger): 'When doing early stopping in DDP, if each "
               "process has a specific conditional that it can check, where it may not be synchronized across "
               "all of them, a `break` can happen on process 0 but not on process 1. As a result this will cause "
               "the code to hang indefinitely until a timeout occurs' (distilled: the main process tracks the "
               "evaluation loss of its own shard and breaks out of the epoch loop when it gets worse).",
    "family": "decision",
    "world_size": 2,
    "kind": "local_decision",
    "ranks": [0],
    "line": "main_process_break",
    "fix": ["set_trigger", "check_trigger", "broadcast", "all_reduce"],
}

import sys
import time
import warnings

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def main():
    warnings.filterwarnings("ignore")
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=generator)
    train = TensorDataset(x, (x[:, 0] > 0).long())
    eval_x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    evaluation = TensorDataset(eval_x, (eval_x[:, 0] < 0).long())  # a shifted evaluation set
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    train_loader, eval_loader = DataLoader(train, batch_size=16), DataLoader(evaluation, batch_size=16)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
    best_loss = float("inf")
    for epoch in range(20):
        model.train()
        for inputs, targets in train_loader:
            mark()
            loss = nn.functional.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():  # this process's shard of the evaluation set, not gathered
            eval_loss = sum(nn.functional.cross_entropy(model(i), t).item() for i, t in eval_loader)
        accelerator.print(f"epoch {epoch}: eval loss {eval_loss:.3f}")
        if accelerator.is_main_process and eval_loss > best_loss:
            print(f"eval loss went up at epoch {epoch}: stopping early", file=sys.stderr, flush=True)
            break  # LINE:main_process_break
        best_loss = min(best_loss, eval_loss)
    mark()
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
