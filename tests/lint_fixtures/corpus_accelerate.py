"""Correct Hugging Face Accelerate loop: main process saves the unwrapped model, everyone waits together."""

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator()
    model = torch.nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = TensorDataset(torch.randn(512, 16), torch.randint(0, 2, (512,)))
    loader = DataLoader(dataset, batch_size=16, shuffle=True)
    eval_loader = DataLoader(dataset, batch_size=64)
    model, optimizer, loader, eval_loader = accelerator.prepare(model, optimizer, loader, eval_loader)

    for epoch in range(3):
        model.train()
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

        model.eval()
        correct = 0
        for x, y in eval_loader:
            with torch.no_grad():
                predictions = model(x).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, y))
            correct += (predictions == references).sum().item()
        if accelerator.is_main_process:
            accelerator.print(f"epoch {epoch}: accuracy {correct / len(dataset):.3f}")

    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        accelerator.save(unwrapped.state_dict(), "model.pt")
    if accelerator.is_local_main_process:
        print("done")


if __name__ == "__main__":
    main()
