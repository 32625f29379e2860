"""DataLoader epochs: how many times each DataLoader was iterated, and the DDP training steps run in each epoch."""

# One wrapper on `DataLoader.__iter__`, which runs once per epoch (a lock, a dict lookup, an append and len(loader),
# the sampler's length); nothing runs per batch. The analysis compares the ranks' per-epoch step counts: equal counts
# until one rank stops beginning epochs is a loop left by a decision, different counts within an epoch is data that
# ran out; equal lengths on every rank mean no rank's data can run out first.

from __future__ import annotations

import threading
import weakref

MAX_LOADERS = 16  # DataLoaders remembered (the newest); a program makes a few
MAX_EPOCHS = 8  # epochs remembered per DataLoader (the last ones)


class Epochs:
    """Each DataLoader's epochs in this process; `steps()` says how many DDP training steps ran so far. Steps count
    for the DataLoader iterated most recently: a validation loader iterated after each training epoch gets none."""

    def __init__(self, steps):
        self._steps = steps
        self._lock = threading.Lock()
        # id(loader) -> [weak ref, ordinal, epochs begun, steps in each epoch, batches]
        self._loaders: dict[int, list] = {}
        self._made = 0
        self._latest: list | None = None  # the entry of the loader iterated last
        self._mark = 0  # the step count when it was

    def began(self, loader) -> None:
        """`loader` was iterated: an epoch begins now."""
        now = self._steps()
        length = _length(loader)
        with self._lock:
            if self._latest is not None:
                self._latest[3][-1] += now - self._mark
            entry = self._loaders.get(id(loader))
            if entry is None or entry[0]() is not loader:
                entry = self._loaders[id(loader)] = [weakref.ref(loader), self._made, 0, [], None]
                self._made += 1
                self._forget_old()
            entry[2] += 1
            entry[3] = entry[3][1 - MAX_EPOCHS :] + [0]
            entry[4] = length
            self._latest, self._mark = entry, now

    def _forget_old(self) -> None:
        if len(self._loaders) > MAX_LOADERS:
            oldest = min(self._loaders, key=lambda key: self._loaders[key][1])
            if self._loaders[oldest] is self._latest:
                self._latest = None
            del self._loaders[oldest]

    def read(self) -> list:
        """[{"loader": ordinal, "epochs": epochs begun, "steps": DDP steps in each of the last epochs, "length":
        batches per epoch (len(loader) when its last epoch began; left out when it has none)}]: the last epoch of
        the loader iterated last runs until now (a loop left early shows a short last epoch)."""
        now = self._steps()
        with self._lock:
            entries = sorted(
                (
                    entry[1],
                    entry[2],
                    list(entry[3]) if entry is not self._latest else entry[3][:-1] + [entry[3][-1] + now - self._mark],
                    entry[4],
                )
                for entry in self._loaders.values()
            )
        return [
            dict(
                {"loader": ordinal, "epochs": epochs, "steps": steps}, **({} if length is None else {"length": length})
            )
            for ordinal, epochs, steps, length in entries
        ]


def _length(loader) -> int | None:
    """len(loader), the batches an epoch yields (the sampler's length over the batch size): None when the
    DataLoader has none (an IterableDataset without __len__) or it cannot be read."""
    try:
        length = len(loader)
    except Exception:  # noqa: BLE001 - TypeError without a length; anything a user's __len__ raises
        return None
    return length if isinstance(length, int) and length >= 0 else None


_current: list = [None]  # the session's Epochs while its patch is in place


def install(patches, steps) -> None:
    """Wrap DataLoader.__iter__ through `patches` (the session's one door; undone with the others)."""
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        return
    _current[0] = None
    epochs = Epochs(steps)

    def make_wrapper(original):
        def __iter__(loader):
            try:
                epochs.began(loader)
            except Exception:  # noqa: BLE001 - bookkeeping: never the user's problem
                pass
            return original(loader)

        return __iter__

    if patches.wrap(DataLoader, "__iter__", make_wrapper) is not None:
        _current[0] = epochs


def read() -> list:
    """This process's DataLoader epochs (Epochs.read), [] when nothing is tracked."""
    epochs = _current[0]
    return epochs.read() if epochs is not None else []
