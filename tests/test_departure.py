"""analysis/departure.py on hand-built traces: the rank whose control flow departed (a local decision or a caught
exception), told apart from data that ran out, rank conditions, and ranks with no history. No torch."""

import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import factory as F  # noqa: E402

from ddpwatch.analysis import assess, incident  # noqa: E402
from ddpwatch.format import validate  # noqa: E402
from ddpwatch.render.text import render_text  # noqa: E402
from ddpwatch.render.wording import worded, worded_incident  # noqa: E402

GRACE, TIMEOUT_S = 2.0, 300.0


def only(trace):
    findings = assess(trace.states, trace.world_size, GRACE, TIMEOUT_S).findings
    assert len(findings) == 1, findings
    return worded(findings[0])


# ---------------------------------------------------------------- a decision on a rank-local value


def test_early_stopping_on_a_local_loss_names_the_rank_that_broke_the_break_and_its_condition():
    f = only(F.trace_early_stop())
    assert (f["kind"], f["ranks"]) == ("local_decision", [0])  # not rank 1, which still trains as it should
    assert f["location"] == {"file": "/u/train.py", "line": 7, "function": "train"}  # the `break`
    departure = f["evidence"]["departure"]
    assert departure["condition"]["text"] == "if stopper.should_stop(local_val_loss()):"
    assert departure["exit"] == {"line": 7, "kind": "break"} and departure["left"] is True
    assert departure["proof"] == {"rule": "began_more", "epochs": 2, "steps": [4], "others_epochs": 3}
    assert "rank 1 began epoch 3, rank 0 did not" in f["summary"]
    assert "(Observed in the run: each rank's DataLoader epochs.)" in f["summary"]  # what the reading rests on
    assert "`if stopper.should_stop(local_val_loss()):`" in f["summary"] and "left the loop `for epoch" in f["summary"]
    assert "all_reduce" in f["fix"] and "broadcast" in f["fix"] and "train.py:7" in f["fix"]
    assert "DistributedSampler" not in f["fix"] and "join()" not in f["fix"]


def test_a_nan_check_return_between_forward_and_backward_needs_no_dataloader():
    f = only(F.trace_nan_return())
    assert (f["kind"], f["ranks"]) == ("local_decision", [1])
    assert f["location"] == {"file": "/u/train.py", "line": 5, "function": "train_until_nan"}
    assert f["evidence"]["departure"]["condition"]["text"] == "if not torch.isfinite(loss):"
    assert f["evidence"]["departure"]["proof"] == {"rule": "within"}
    assert "returned from train_until_nan()" in f["summary"] and "mid-iteration" in f["summary"]


CONTINUE_SOURCE = """def train(model, data):
    for x, y in data:
        loss = model(x).sum()
        if loss.item() > limit:
            continue
        loss.backward()
"""


def test_a_continue_on_a_local_value_between_forward_and_backward_is_a_local_decision():
    f = only(F.trace_caught_exception(CONTINUE_SOURCE, forward_line=3, backward_line=6))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [1], 5)
    assert "skipped the rest of that iteration" in f["summary"]


WHILE_SOURCE = """def train(model, data, stopper):
    while True:
        loss = model(next(data)).sum()
        loss.backward()
        if stopper.should_stop(loss.item()):
            break
    dist.barrier()
"""


def test_a_local_break_out_of_while_true_is_a_decision_without_epochs():
    f = only(F.trace_early_stop(epochs=(None, None), source=WHILE_SOURCE, step=4, after=("train.py", 7, "train")))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [0], 6)
    assert f["evidence"]["departure"]["proof"] == {"rule": "endless"}
    assert "ends only by an exit. (Read from the source.)" in f["summary"]


STREAM_SOURCE = """def stream(shard):
    while True:
        yield from shard

def train(model, shard, budget):
    for x in stream(shard):
        loss = model(x).sum()
        loss.backward()
        if clock() > budget:
            break
    dist.barrier()
"""


def test_a_local_break_out_of_a_loop_over_an_endless_generator_is_a_decision_not_uneven_data():
    # Issue 42 (b): the generator never returns, so rank 0 left by its break; before, uneven_inputs on rank 1
    f = only(F.trace_early_stop(epochs=(None, None), source=STREAM_SOURCE, step=8, after=("train.py", 11, "train")))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [0], 10)
    assert f["evidence"]["departure"]["proof"] == {"rule": "endless"}


NAMED_SOURCE = """def train(model, batches, budget):
    for x in batches:
        loss = model(x).sum()
        loss.backward()
        if clock() > budget:
            break
    dist.barrier()
"""


def _holding(trace, rank, ended):
    """The trace with `rank` holding the loop's iterator `batches` (capture/iterators.py), run out or not."""
    held = {"file": "/u/train.py", "function": "train", "name": "batches", "kind": "generator stream()", "ended": ended}
    trace.states[rank]["iterators"] = [held]
    return trace


def test_a_break_out_of_a_loop_over_a_named_iterator_it_still_holds_is_a_decision_observed():
    # Issue 42: the header names no generator (`for x in batches:`); rank 0 still holds `batches`, not run out
    trace = _holding(
        F.trace_early_stop(epochs=(None, None), source=NAMED_SOURCE, step=4, after=("train.py", 7, "train")), 0, False
    )
    f = only(trace)
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [0], 6)
    proof = f["evidence"]["departure"]["proof"]
    assert proof == {"rule": "not_ended", "basis": "observed", "name": "batches", "iterator": "generator stream()"}
    assert "still held `batches` (generator stream()) with items left" in f["summary"]
    assert "(Observed in the run: the iterator its own frame held" in f["summary"]


def test_the_same_loop_with_its_iterator_run_out_or_unseen_stays_uneven_inputs():
    for ended in (True, None):
        trace = F.trace_early_stop(epochs=(None, None), source=NAMED_SOURCE, step=4, after=("train.py", 7, "train"))
        if ended is not None:
            _holding(trace, 0, ended)
        f = only(trace)
        assert (f["kind"], f["ranks"]) == ("uneven_inputs", [1]), ended


RETURN_AT_THE_END_SOURCE = """def train(model, data):
    for epoch in range(3):
        for x, y in data:
            loss = model(x).sum()
            loss.backward()
            if local_check(loss):
                return
    dist.barrier()
"""


def test_a_short_last_epoch_after_equal_epochs_is_a_decision_equal_short_epochs_are_uneven_data():
    decided = F.trace_early_stop(
        epochs=((2, [4, 2]), (2, [4, 3])), source=RETURN_AT_THE_END_SOURCE, after=("main.py", 31, "main")
    )  # returned from train(): in main() now
    f = only(decided)
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [0], 7)
    assert f["evidence"]["departure"]["proof"]["rule"] == "short_last_epoch"
    uneven = copy.deepcopy(decided)
    uneven.states[0]["epochs"] = [{"loader": 0, "epochs": 2, "steps": [3, 3]}]
    uneven.states[1]["epochs"] = [{"loader": 0, "epochs": 2, "steps": [4, 4]}]
    assert only(uneven)["kind"] == "uneven_inputs"


# ---------------------------------------------------------------- an exception caught on one rank


def test_a_caught_exception_names_the_rank_the_except_line_and_what_it_skipped():
    f = only(F.trace_caught_exception())
    assert (f["kind"], f["ranks"]) == ("caught_exception", [1])  # not both ranks
    assert f["location"] == {"file": "/u/train.py", "line": 5, "function": "train"}  # the `except` line
    assert f["evidence"]["departure"]["handler"] == {"line": 5, "text": "except ValueError:"}
    assert "skipped all_reduce of gradients inside backward() at train.py:7, where rank 0 waits" in f["summary"]
    assert "then `continue`" in f["summary"]
    assert f["fix"].startswith("Skip together, or do not skip") and "all_reduce" in f["fix"]
    assert "zero the loss" in f["fix"]


PASS_SOURCE = """def train(model, data):
    for x, y in data:
        try:
            loss = checked(model(x), y)
            loss.backward()
        except ValueError:
            pass
"""


def test_an_except_pass_around_forward_and_backward_skips_backward_too():
    f = only(F.trace_caught_exception(PASS_SOURCE, forward_line=4, backward_line=5))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("caught_exception", [1], 6)
    assert "then `pass`" in f["summary"]


# ---------------------------------------------------------------- what stays as it was


def test_a_loop_without_an_exit_ran_out_of_data_and_stays_uneven_inputs():
    source = F.EARLY_STOP_SOURCE.replace(
        "        if stopper.should_stop(local_val_loss()):\n            break\n", "        pass\n        pass\n"
    )
    f = only(F.trace_early_stop(source=source))
    assert (f["kind"], f["ranks"]) == ("uneven_inputs", [1])


def test_different_steps_per_epoch_or_no_dataloader_keep_uneven_inputs_for_a_break_where_an_iteration_ends():
    for epochs in (((2, [3, 3]), (2, [4, 4])), (None, None), ((2, [4, 4]), None)):
        f = only(F.trace_early_stop(epochs=epochs))
        assert (f["kind"], f["ranks"]) == ("uneven_inputs", [1]), epochs


def test_a_break_under_a_rank_condition_is_left_to_the_rank_condition_rules():
    source = F.EARLY_STOP_SOURCE.replace("if stopper.should_stop(local_val_loss()):", "if rank == 0 and epoch == 1:")
    assert only(F.trace_early_stop(source=source))["kind"] == "uneven_inputs"
    trace = F.trace_caught_exception()
    trace.states[0]["rank_condition"] = {
        "frame": F.as_site(("train.py", 7, "train")),
        "condition": {"line": 2, "text": "if rank == 0:", "kind": "if"},
    }
    assert only(trace)["kind"] != "caught_exception"


def test_without_the_source_read_or_the_history_nothing_is_reclassified():
    trace = F.trace_caught_exception()
    for state in trace.states.values():
        del state["code"]  # a heartbeat's state: the first look, before the incident's full states
    assert only(trace)["kind"] == "collective_mismatch"
    short = F.trace_caught_exception()
    for state in short.states.values():
        state["recent"] = state["recent"][-1:]  # one finished call: no move was made before
    assert only(short)["kind"] not in ("caught_exception", "local_decision")
    assert only(F.trace_different_collectives())["kind"] == "collective_mismatch"


def test_when_every_rank_departs_from_its_history_none_is_named():
    trace = F.trace_caught_exception()
    trace.states[0]["inflight"] = [F.barrier(5, ("train.py", 8, "train"))]
    assert only(trace)["kind"] not in ("caught_exception", "local_decision")


# ---------------------------------------------------------------- a saved report says the same


def test_a_saved_report_validates_reanalyses_to_the_same_finding_and_renders():
    trace = F.trace_early_stop()
    built = worded_incident(incident.build(trace.states, 2, GRACE, TIMEOUT_S, run_id="r"))
    read_back = json.loads(json.dumps(built))
    validate.incident(read_back, "report.json")
    again = incident.reanalyze(read_back)
    assert [(f["kind"], f["ranks"], f["location"]) for f in again["findings"]] == [
        ("local_decision", [0], {"file": "/u/train.py", "line": 7, "function": "train"})
    ]
    text = render_text(F.incident(trace.states, again["findings"]))
    assert "[local_decision] culprit: rank 0 at train.py:7" in text


def test_source_readings_and_epochs_in_another_shape_are_ignored_not_an_error():
    trace = F.trace_caught_exception()
    for state in trace.states.values():
        state["code"] = {key: {"function": [1], "loops": "x", "tries": None} for key in state["code"]}
    assert only(trace)["kind"] == "collective_mismatch"
    early = F.trace_early_stop()
    early.states[0]["epochs"] = [{"loader": 0, "epochs": 1, "steps": [4, 4, True]}, "x"]
    assert only(early)["kind"] == "uneven_inputs"


# ---------------------------------------------------------------- loops that run as many iterations on every rank


def test_a_break_out_of_loops_over_range_of_constants_is_a_decision_without_a_dataloader():
    f = only(F.trace_counted_early_stop())
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [0], 7)
    assert f["evidence"]["departure"]["proof"] == {
        "rule": "counted",
        "loops": ["for step in range(8):", "for epoch in range(EPOCHS):"],
    }
    assert "`for step in range(8):`, `for epoch in range(EPOCHS):` run as many iterations on every rank" in f["summary"]


def test_a_loop_over_a_length_or_with_a_skip_as_well_as_the_break_proves_nothing():
    data_sized = F.COUNTED_STOP_SOURCE.replace("range(8)", "range(len(data))")
    assert only(F.trace_counted_early_stop(data_sized))["kind"] == "uneven_inputs"
    # a continue could have skipped iterations just as well: which one it took, the loops do not say
    skipping = F.COUNTED_STOP_SOURCE.replace(
        "            loss.backward()\n",
        "            if loss.isnan():\n                continue\n            loss.backward()\n",
    )
    trace = F.trace_early_stop(epochs=(None, None), source=skipping, step=7, after=("train.py", 10, "train"))
    assert only(trace)["kind"] == "uneven_inputs"


def test_a_rank_that_finished_counted_loops_short_of_collectives_skipped_an_iteration_by_the_one_way_they_offer():
    f = only(F.trace_skipped_iteration())
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("caught_exception", [1], 6)  # the except line
    proof = f["evidence"]["departure"]["proof"]
    assert proof["rule"] == "counted" and proof["skipped"] is True
    assert "in an earlier iteration, and so skipped that iteration's collectives" in f["summary"]
    assert "this `continue` is the one way the loops offer" in f["summary"]
    assert f["fix"].startswith("Skip together")
    # a way out placed after every collective of the loop skips none of them: still the one way
    after = F.SKIPPED_SOURCE.replace("        optimizer.step()\n", "        if bad(step): continue\n")
    assert only(F.trace_skipped_iteration(after))["location"]["line"] == 6
    # two ways before the collective (a break out of the micro-batches as well): which one, the loops do not say
    two_ways = F.SKIPPED_SOURCE.replace("anchors = sample_anchors(lengths)", "if short(lengths): break")
    assert only(F.trace_skipped_iteration(two_ways))["kind"] == "uneven_inputs"
    over_data = F.SKIPPED_SOURCE.replace("in micro_batches(step):", "in loader:")
    assert only(F.trace_skipped_iteration(over_data))["kind"] == "uneven_inputs"


def test_dataloaders_of_equal_length_in_the_same_epoch_prove_it_as_counted_loops_do():
    over_data = F.SKIPPED_SOURCE.replace("in micro_batches(step):", "in loader:")
    equal = ((1, [3], {"length": 4}), (1, [4], {"length": 4}))
    f = only(F.trace_skipped_iteration(over_data, epochs=equal))
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("caught_exception", [1], 6)
    assert f["evidence"]["departure"]["proof"] == {"rule": "equal_lengths", "length": 4, "epochs": 1, "skipped": True}
    assert "every rank's DataLoader has 4 batches per epoch and every rank is in epoch 1" in f["summary"]
    for uneven in (
        ((1, [3], {"length": 3}), (1, [4], {"length": 4})),
        ((1, [3], {}), (1, [4], {})),
        ((2, [4, 3], {"length": 4}), (1, [4], {"length": 4})),
    ):
        assert only(F.trace_skipped_iteration(over_data, epochs=uneven))["kind"] == "uneven_inputs", uneven


# ---------------------------------------------------------------- an except handler that talks to the others


def test_a_rank_in_an_except_handler_whose_try_holds_the_others_caught_an_exception_no_history_needed():
    f = only(F.trace_handler_collective())
    assert (f["kind"], f["ranks"], f["location"]) == (
        "caught_exception",
        [1],
        {"file": "/u/train.py", "line": 15, "function": "main"},
    )
    assert f["evidence"]["departure"]["proof"] == {"rule": "in_handler", "try": 13, "at": 17, "others_at": 14}
    assert "raised on rank 1 only, in the try at train.py:13" in f["summary"]
    assert "still in the try's body" in f["summary"]
    assert "all_reduce a flag" in f["fix"] and "every rank" in f["fix"]


def test_a_handler_rank_under_a_rank_condition_or_ranks_in_the_same_place_are_not_named():
    trace = F.trace_handler_collective(F.HANDLER_SOURCE.replace("    except Exception:\n", "    except Exception:\n"))
    trace.states[1]["rank_condition"] = {
        "frame": F.as_site(("train.py", 9, "save_checkpoint")),
        "condition": {"line": 8, "text": "if rank == 1:", "kind": "if"},
    }
    assert only(trace)["kind"] != "caught_exception"
    body = F.trace_handler_collective(
        F.HANDLER_SOURCE.replace("    try:\n", "    if True:\n").replace("    except Exception:\n", "    else:\n")
    )
    assert only(body)["kind"] != "caught_exception"


# ---------------------------------------------------------------- the others went past the call a rank stands in


def test_ranks_back_in_the_loop_went_past_the_call_the_others_stand_in_and_returned_before_its_collective():
    f = only(F.trace_passed_by())
    assert (f["kind"], f["ranks"]) == ("local_decision", [1])  # not rank 0, whose move is the new one
    assert f["location"] == {"file": "/u/train.py", "line": 3, "function": "compute_epoch_metrics"}
    departure = f["evidence"]["departure"]
    assert departure["condition"]["text"] == "if len(targets) == 0:"
    assert departure["proof"] == {
        "rule": "passed_by",
        "by": "counted",
        "loops": ["for _ in range(3):"],
        "at": 12,
        "call": 4,
    }
    assert "returned from compute_epoch_metrics() before the collective at train.py:4" in f["summary"]
    assert "Rank 0 stands in the call made at train.py:12, which rank 1 went past" in f["summary"]


def test_passing_by_needs_the_loops_before_the_call_to_run_as_many_iterations():
    over_data = F.PASSED_BY_SOURCE.replace("range(3)", "loader")
    assert only(F.trace_passed_by(over_data))["kind"] == "uneven_inputs"  # rank 1 may just have more batches
    began = ((1, [3], {}), (2, [3, 0], {}))
    f = only(F.trace_passed_by(over_data, epochs=began))  # rank 1 began epoch 2 after as many steps: it went past
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [1], 3)
    assert f["evidence"]["departure"]["proof"]["by"] == "began_more"
    assert "rank 1 began epoch 2, rank 0 did not" in f["summary"]
    two_returns = F.PASSED_BY_SOURCE.replace(
        '    return {"iou"', '    if not ready(metric):\n        return {}\n    return {"iou"'
    )
    assert only(F.trace_passed_by(two_returns))["kind"] != "local_decision"


# ---------------------------------------------------------------- a helper decided, the caller passed it on

HELPER_SOURCE = """def training_step(model, x):
    loss = model(x).sum()
    if torch.isnan(loss):
        return None
    return loss


def train(model, data):
    for x, y in data:
        loss = training_step(model, x)
        if loss is None:
            continue
        loss.backward()
"""


def test_an_exit_on_what_a_helper_returned_is_located_at_the_helpers_return_with_the_callers_exit_named():
    trace = F.trace_caught_exception(HELPER_SOURCE, forward_line=2, backward_line=13)
    for state in trace.states.values():  # the helper's frame under train()'s call, as a real stack has it
        state["code"].update(F.code_of(HELPER_SOURCE, (10,)))
    trace.states[1]["stacks"] = [
        F.main_stack(("main.py", 30, "main"), ("train.py", 10, "train"), ("train.py", 2, "training_step"))
    ]
    f = only(trace)
    assert (f["kind"], f["ranks"]) == ("local_decision", [1])
    assert f["location"] == {"file": "/u/train.py", "line": 4, "function": "training_step"}
    departure = f["evidence"]["departure"]
    assert departure["condition"]["text"] == "if torch.isnan(loss):" and departure["exit"]["line"] == 12
    assert departure["helper"]["caller_condition"]["text"] == "if loss is None:"
    assert "returned (`return None`) at train.py:4 from training_step() under `if torch.isnan(loss):`" in f["summary"]
    assert "the caller took the `continue` at train.py:12 (`if loss is None:`)" in f["summary"]
    assert "behind `if torch.isnan(loss):`" in f["fix"] and "the caller's `continue` at train.py:12" in f["fix"]


# ---------------------------------------------------------------- a departed rank that exited


def test_a_rank_that_left_the_loop_by_a_decision_and_exited_is_named_as_departed_not_as_skipping():
    f = only(F.trace_exited_after_early_stop())
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [0], 7)
    assert "and rank 0 exited." in f["summary"]
    # without proof (a loop over data, no DataLoader epochs from an exited rank) the exited-rank rule decides
    over_data = F.COUNTED_STOP_SOURCE.replace("for step in range(8):", "for x in data:")
    assert only(F.trace_exited_after_early_stop(over_data))["kind"] == "skipped_collective"
    assert only(F.trace_exited_peer())["kind"] == "skipped_collective"


def test_a_departed_rank_that_went_on_through_a_collective_the_others_never_joined_is_still_named():
    f = only(F.trace_departed_ahead())
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("caught_exception", [1], 5)
    assert f["evidence"]["sequence"] == {"group": "0", "seq": 5}
    assert f["facts"]["record"]["seq"] == 6  # where rank 1 waits now, past the position it diverged at


def test_passing_by_needs_no_repeated_move_only_the_same_calls_behind_every_rank():
    trace = F.trace_passed_by()
    rebuild = F.rec(
        1,
        "broadcast",
        api="Reducer._rebuild_buckets",
        site=F.DDP_INTERNAL_SITE,
        region=F.ddp_region(("train.py", 10, "main")),
        state="completed",
        age=30.0,
    )
    for state in trace.states.values():  # DDP's bucket rebuild after the first step: no move made twice yet
        state["recent"] = [state["recent"][0], rebuild, state["recent"][2]]
    f = only(trace)
    assert (f["kind"], f["ranks"], f["location"]["line"]) == ("local_decision", [1], 3)
    trace.states[1]["recent"] = trace.states[1]["recent"][:1] + trace.states[1]["recent"][2:]
    assert only(trace)["kind"] != "local_decision"  # not the same calls behind them
