"""huggingface/transformers#31532: evaluation is triggered off a progress bar that only the main process advances."""

EXPECT = {
    "source": "https://github.com/huggingface/transformers/issues/31532",
    "summary": "'Process hangs when evaluating the model before finishing an epoch using accelerate in a multi-GPU "
               "environment (no trainer)': the progress bar was enabled only on the main process, so only the "
               "main process entered the evaluation part and gather_for_metrics waited for the others forever.",
    "family": "collective",
    "world_size": 2,
    "kind": "collective_on_subset",
    "ranks": [0],
    "line": "gather_metrics",
    "fix": ["every rank", "all ranks", "every process"],
}

import sys
import time
import warnings

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

EVAL_STEPS = 3


def mark():
    # Printed before every collective-bearing step: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def evaluate(accelerator, model, eval_loader):
    model.eval()
    correct = []
    with torch.no_grad():
        for x, y in eval_loader:
            predictions = model(x).argmax(-1)
            mark()
            predictions, labels = accelerator.gather_for_metrics((predictions, y))  # LINE:gather_metrics
            correct.append(predictions == labels)
    model.train()
    return torch.cat(correct).float().mean().item()


def main():
    warnings.filterwarnings("ignore")
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader, eval_loader = DataLoader(data, batch_size=8), DataLoader(data, batch_size=16)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
    progress_bar = tqdm(range(len(train_loader)), disable=not accelerator.is_main_process, file=sys.stderr)
    for x, y in train_loader:
        mark()
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        progress_bar.update(1)
        if progress_bar.n > 0 and progress_bar.n % EVAL_STEPS == 0:  # a disabled bar never counts: n stays 0
            accuracy = evaluate(accelerator, model, eval_loader)
            accelerator.print(f"step {progress_bar.n}: accuracy {accuracy:.2f}")
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
