"""capture/loaders.py: each DataLoader's epochs and the DDP steps in each, from one wrapper on DataLoader.__iter__."""

from ddpwatch.capture import loaders
from ddpwatch.capture.replacements import Patches


class Counter:
    def __init__(self):
        self.steps = 0

    def __call__(self):
        return self.steps


def test_each_epoch_counts_the_training_steps_run_while_its_loader_was_the_last_iterated():
    steps, train, val = Counter(), object.__new__(type("Loader", (), {})), object.__new__(type("Val", (), {}))
    epochs = loaders.Epochs(steps)
    for _ in range(3):
        epochs.began(train)
        steps.steps += 4
        epochs.began(val)  # validation under no_grad: no training step
    epochs.began(train)
    steps.steps += 1
    assert epochs.read() == [
        {"loader": 0, "epochs": 4, "steps": [4, 4, 4, 1]},
        {"loader": 1, "epochs": 3, "steps": [0, 0, 0]},
    ]


def test_only_the_last_epochs_and_the_newest_loaders_are_kept():
    steps = Counter()
    epochs = loaders.Epochs(steps)
    kept = [type(f"L{i}", (), {})() for i in range(loaders.MAX_LOADERS + 3)]
    for _ in range(loaders.MAX_EPOCHS + 5):
        epochs.began(kept[0])
        steps.steps += 2
    for loader in kept[1:]:
        epochs.began(loader)
    read = epochs.read()
    assert len(read) == loaders.MAX_LOADERS and read[0]["loader"] == 3  # the oldest went first
    assert epochs.read()  # still readable
    first = loaders.Epochs(Counter())
    first.began(kept[0])
    assert first.read() == [{"loader": 0, "epochs": 1, "steps": [0]}]


def test_the_wrapper_counts_real_dataloader_epochs_runs_once_per_epoch_and_is_undone(monkeypatch):
    """What it costs is counted, not timed: `began` runs once per epoch and never per batch (its time per call is a
    row of `python -m benchmarks.overhead_ops --quick`'s parts table)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    calls = []
    real_began = loaders.Epochs.began
    monkeypatch.setattr(loaders.Epochs, "began", lambda self, loader: calls.append(loader) or real_began(self, loader))
    steps, patches = Counter(), Patches()
    original = DataLoader.__iter__
    loaders.install(patches, steps)
    try:
        data = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2)
        for _ in range(2):
            for _batch in data:
                steps.steps += 1
        assert calls == [data, data]  # 2 epochs of 4 batches: 2 calls
        assert loaders.read() == [{"loader": 0, "epochs": 2, "steps": [4, 4], "length": 4}]  # len(data): 4 batches
    finally:
        patches.undo()
    assert DataLoader.__iter__ is original


class Sized:
    def __init__(self, length):
        self.length = length

    def __len__(self):
        if isinstance(self.length, Exception):
            raise self.length
        return self.length


def test_each_loader_says_its_length_when_its_last_epoch_began_and_none_when_it_has_none():
    steps = Counter()
    epochs = loaders.Epochs(steps)
    sized, unsized, broken = Sized(5), object.__new__(type("Stream", (), {})), Sized(RuntimeError("no length"))
    for loader in (sized, unsized, broken):
        epochs.began(loader)
    sized.length = 6  # a length read at each epoch's start: the last one is kept
    epochs.began(sized)
    assert epochs.read() == [
        {"loader": 0, "epochs": 2, "steps": [0, 0], "length": 6},
        {"loader": 1, "epochs": 1, "steps": [0]},
        {"loader": 2, "epochs": 1, "steps": [0]},
    ]
