"""capture/iterators.py: which iterators a frame holds, and whether each had run out, read without advancing them."""

import itertools
import sys
import threading

import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpwatch.capture import iterators


def stream(items):
    while True:
        yield from items


STREAM_YIELD = stream.__code__.co_firstlineno + 2  # its `yield from items`


def finite(items):
    yield from items


def test_a_generator_left_by_a_break_is_not_ended_one_that_returned_is():
    batches = stream([1, 2])
    for _ in batches:
        break
    done = finite([1])
    for _ in done:
        pass
    assert iterators.describe(batches) == {"kind": "generator stream()", "ended": False, "at_line": STREAM_YIELD}
    assert iterators.describe(done) == {"kind": "generator finite()", "ended": True}
    assert iterators.describe(finite([1])) is None  # never started: no loop ran over it


def test_a_dataloader_iterator_says_how_many_batches_it_gave_of_how_many():
    loader = DataLoader(TensorDataset(torch.zeros(12, 2)), batch_size=4)
    it = iter(loader)
    next(it)
    assert iterators.describe(it) == {"kind": "DataLoader iterator", "ended": False, "yielded": 1, "length": 3}
    list(it)
    assert iterators.describe(it)["ended"] is True


def test_builtin_iterators_by_what_is_left_and_itertools_that_never_end():
    it = iter([1, 2, 3])
    next(it)
    assert iterators.describe(it) == {"kind": "list_iterator", "ended": False, "left": 2}
    list(it)
    assert iterators.describe(it)["ended"] is True
    assert iterators.describe(itertools.cycle([1])) == {"kind": "itertools.cycle", "ended": False}
    assert iterators.describe([1, 2]) is None and iterators.describe("text") is None and iterators.describe(3) is None


def test_the_main_threads_user_frames_are_read_from_another_thread_innermost_first():
    held = stream([1, 2])
    next(held)
    seen = []
    reader = threading.Thread(
        target=lambda: seen.extend(iterators.main_thread_iterators(lambda path: path == __file__))
    )
    reader.start()
    reader.join()
    test = sys._getframe().f_code.co_name
    mine = [it for it in seen if it["function"] == test]
    assert mine == [
        {
            "file": __file__,
            "function": mine[0]["function"],
            "name": "held",
            "kind": "generator stream()",
            "ended": False,
            "at_line": STREAM_YIELD,
        }
    ]
    assert iterators.main_thread_iterators(lambda path: False) == []  # no user frame: nothing read
