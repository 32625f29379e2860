"""static.exits: the loops around a line, each loop's exits with the `if` over them, and the try blocks around it."""

import textwrap

from ddpwatch.static.exits import code_around, code_around_source, code_of_state

SOURCE = textwrap.dedent("""\
    def train(model, data, rank):
        for epoch in range(20):
            for x, y in data:
                loss = model(x).sum()
                if not torch.isfinite(loss):  # a NaN check
                    return
                try:
                    loss.backward()
                except RuntimeError:
                    continue
                for micro in range(4):
                    if micro == 2:
                        break
            if stopper.should_stop(loss):
                break
            elif rank == 0 and epoch == 3:
                break
            else:
                continue

            def helper():
                return 1
        while True:
            if done():
                break
""")


def exits(around, index):
    return [(e["line"], e["kind"]) for e in around["loops"][index]["exits"]]


def test_the_loops_around_a_line_innermost_first_with_their_headers():
    around = code_around_source(SOURCE, 4)
    assert around["function"] == [1, 25]
    assert [(loop["line"], loop["end"], loop["text"]) for loop in around["loops"]] == [
        (3, 13, "for x, y in data:"),
        (2, 22, "for epoch in range(20):"),
    ]
    assert not any(loop["endless"] for loop in around["loops"])


def test_a_loops_exits_are_its_own_breaks_and_continues_and_every_return_inside_it():
    around = code_around_source(SOURCE, 4)
    # the inner loop: the NaN return and the continue in the except handler; the micro-batch loop's break is its own
    assert exits(around, 0) == [(6, "return"), (10, "continue")]
    # the epoch loop: the return inside its inner loop, then its own breaks and continue; not the nested def's return
    assert exits(around, 1) == [(6, "return"), (15, "break"), (17, "break"), (19, "continue")]


def test_each_exit_carries_the_innermost_if_over_it_and_whether_it_is_a_rank_condition():
    around = code_around_source(SOURCE, 4)
    nan_return, caught = around["loops"][0]["exits"]
    assert nan_return["condition"] == {
        "line": 5,
        "text": "if not torch.isfinite(loss):",
        "rank": False,
        "branch": "if",
    }  # the comment is not the condition
    assert nan_return["handler"] is None
    assert caught["condition"] is None and caught["handler"] == {"line": 9, "text": "except RuntimeError:"}
    _, stop, rank_break, otherwise = around["loops"][1]["exits"]
    assert stop["condition"]["text"] == "if stopper.should_stop(loss):" and not stop["condition"]["rank"]
    assert rank_break["condition"]["text"] == "elif rank == 0 and epoch == 3:" and rank_break["condition"]["rank"]
    assert otherwise["condition"]["line"] == 16 and otherwise["condition"]["branch"] == "else"


def test_the_try_blocks_whose_body_holds_the_line_and_what_each_handler_does_last():
    assert code_around_source(SOURCE, 4)["tries"] == []
    assert code_around_source(SOURCE, 8)["tries"] == [
        {
            "line": 7,
            "body_end": 8,
            "handlers": [{"line": 9, "end": 10, "text": "except RuntimeError:", "then": "continue"}],
        }
    ]
    source = (
        "for x in data:\n    try:\n        f(x)\n    except ValueError:\n        log(x)\n    except KeyError:\n"
        "        pass\n    except OSError:\n        raise\n"
    )
    [block] = code_around_source(source, 3)["tries"]
    assert [h["then"] for h in block["handlers"]] == ["falls", "pass", "raise"]


def test_while_true_is_endless_and_module_level_code_has_the_whole_file_as_its_function():
    around = code_around_source(SOURCE, 25)
    assert around["loops"][0]["endless"] and exits(around, 0) == [(25, "break")]
    top = code_around_source("x = 1\nfor i in range(3):\n    f(i)\n", 3)
    assert top["function"] == [1, 3] and top["loops"][0]["text"] == "for i in range(3):"


def test_bad_input_is_no_answer_never_an_error(tmp_path):
    assert code_around_source("def broken(:\n", 1) is None
    assert code_around(str(tmp_path / "missing.py"), 3) is None
    assert code_around(str(tmp_path / "missing.py"), True) is None
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    assert code_around(str(path), 4) == code_around_source(SOURCE, 4)


def test_a_rank_state_is_read_at_its_main_frames_and_its_records_user_lines(tmp_path):
    path = str(tmp_path / "train.py")
    open(path, "w").write(SOURCE)
    state = {
        "stacks": [
            {
                "main": True,
                "frames": [
                    {"file": path, "line": 8, "function": "train", "internal": False},
                    {"file": "/torch/x.py", "line": 3, "function": "f", "internal": True},
                ],
            },
            {"main": False, "frames": [{"file": path, "line": 25, "function": "train", "internal": False}]},
        ],
        "inflight": [
            {
                "site": {"file": path, "line": 4, "function": "train"},
                "region": {"kind": "ddp_forward", "site": {"file": path, "line": 4, "function": "train"}},
            }
        ],
        "recent": [
            {"site": {"file": "<stdin>", "line": 1, "function": "f"}},
            {"site": {"file": str(tmp_path / "gone.py"), "line": 1, "function": "f"}},
        ],
    }
    code = code_of_state(state)
    assert sorted(code) == [f"{path}:4", f"{path}:8"]  # not other threads, internal frames, <stdin> or missing files
    assert code_of_state(state, user_file=lambda file: False) == {}


COUNTED = textwrap.dedent("""\
    import itertools
    EPOCHS = 3
    steps = 4 * EPOCHS

    def micro_batches(rank, step):
        for micro in range(ACCUMULATION):
            x = load(rank, step, micro)
            yield micro, x

    def filtered(data):
        for x in range(10):
            if x:
                yield x

    def train(model, data, epochs, rank):
        n = len(data)
        limit = 5 if rank == 0 else 7
        for epoch in range(EPOCHS):
            for step in range(steps):
                pass
            for i, x in enumerate(tqdm(range(0, 2 * steps, 2))):
                pass
            for micro, x in micro_batches(rank, epoch):
                pass
            for x in data:
                pass
            for x in range(n):
                pass
            for x in range(epochs):
                pass
            for x in range(limit):
                pass
            for x in filtered(data):
                pass
            for x in zip(range(3), data):
                pass
            for x in itertools.count():
                pass
""")


def test_a_loop_is_counted_when_its_iterator_yields_as_many_items_on_every_rank():
    loops = {}
    for line in range(20, 39, 2):  # each inner loop's `pass`
        loop = code_around_source(COUNTED, line)["loops"][0]
        loops[loop["text"]] = (loop["counted"], loop["endless"])
    assert loops == {
        "for step in range(steps):": (True, False),  # a module constant times a literal
        "for i, x in enumerate(tqdm(range(0, 2 * steps, 2))):": (True, False),  # wrappers keep the count
        "for micro, x in micro_batches(rank, epoch):": (True, False),  # one yield per counted iteration
        "for x in data:": (False, False),  # data: it may run out on one rank first
        "for x in range(n):": (False, False),  # a length
        "for x in range(epochs):": (False, False),  # a parameter: the caller may pass anything
        "for x in range(limit):": (False, False),  # set from the rank
        "for x in filtered(data):": (False, False),  # a yield under a condition
        "for x in zip(range(3), data):": (False, False),  # zip ends with its shortest
        "for x in itertools.count():": (False, True),  # ends only by an exit
    }
    assert code_around_source(COUNTED, 20)["loops"][1]["counted"]  # `for epoch in range(EPOCHS):`


ENDLESS = textwrap.dedent("""\
    import itertools
    from itertools import cycle, repeat

    def stream(shard):
        while True:
            yield from shard

    def stream_once(shard):
        while True:
            for x in shard:
                yield x
            break

    def stream_or_stop(shard):
        while True:
            if not shard:
                return
            yield from shard

    def header_then_stream(shard):
        yield "header"
        while True:
            yield from shard

    def train(shard, n):
        for x in stream(shard):
            pass
        for i, x in enumerate(stream(shard)):
            pass
        for x in itertools.cycle(shard):
            pass
        for x in cycle(shard):
            pass
        for x in repeat(shard):
            pass
        for x in repeat(shard, n):
            pass
        for x in stream_once(shard):
            pass
        for x in stream_or_stop(shard):
            pass
        for x in header_then_stream(shard):
            pass
        while 1:
            pass
""")


def test_a_loop_over_an_iterator_that_never_runs_out_is_endless():
    # Issue 42: `for x in stream(shard)` over `def stream(shard): while True: yield from shard` was read as a loop
    # whose data may run out, and a per-rank budget's break out of it was reported as uneven inputs.
    loops = {}
    lines = ENDLESS.splitlines()
    for line, text in enumerate(lines, 1):
        if text.strip() == "pass":
            loop = code_around_source(ENDLESS, line)["loops"][0]
            loops[loop["text"]] = loop["endless"]
    assert loops == {
        "for x in stream(shard):": True,
        "for i, x in enumerate(stream(shard)):": True,
        "for x in itertools.cycle(shard):": True,
        "for x in cycle(shard):": True,
        "for x in repeat(shard):": True,
        "for x in repeat(shard, n):": False,  # n items
        "for x in stream_once(shard):": False,  # a break leaves its `while True`
        "for x in stream_or_stop(shard):": False,  # it may return
        "for x in header_then_stream(shard):": False,  # a yield outside its endless loop: read conservatively
        "while 1:": True,
    }


HELPER = textwrap.dedent("""\
    def training_step(model, batch):
        loss = model(batch)
        if torch.isnan(loss):
            return None
        if rank == 0 and debug:
            return 0
        return loss

    def metrics(targets):
        if len(targets) == 0:
            return {}
        return {"iou": compute()}

    def train(model, data):
        for batch in data:
            loss = training_step(model, batch)
            if loss is None:
                continue
            m = metrics(batch)
            if not m:
                continue
            if loss == 0:
                continue
            loss.backward()
""")


def test_an_exit_on_what_a_helper_returned_names_the_helpers_return_that_decided_it():
    exits = code_around_source(HELPER, 24)["loops"][0]["exits"]
    assert [(e["line"], e.get("decided_in", {}).get("line")) for e in exits] == [(18, 4), (21, 11), (23, 6)]
    decided = exits[0]["decided_in"]
    assert decided == {
        "line": 4,
        "function": "training_step",
        "text": "return None",
        "condition": {"line": 3, "text": "if torch.isnan(loss):", "rank": False, "branch": "if"},
    }
    assert exits[2]["decided_in"]["condition"]["rank"]  # `return 0` under a rank condition: said so


def test_a_functions_own_returns_with_the_if_over_each_and_a_handlers_last_line():
    around = code_around_source(HELPER, 12)
    assert [(r["line"], (r["condition"] or {}).get("text")) for r in around["returns"]] == [
        (11, "if len(targets) == 0:"),
        (12, None),
    ]
    assert code_around_source("x = 1\n", 1)["returns"] == []
    source = "def f():\n    try:\n        g()\n    except ValueError:\n        h()\n        k()\n    done()\n"
    assert code_around_source(source, 3)["tries"][0]["handlers"][0]["end"] == 6
