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
    decided = F.trace_early_stop(epochs=((2, [4, 2]), (2, [4, 3])), source=RETURN_AT_THE_END_SOURCE,
                                 after=("main.py", 31, "main"))  # returned from train(): in main() now
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
    source = F.EARLY_STOP_SOURCE.replace("        if stopper.should_stop(local_val_loss()):\n            break\n",
                                         "        pass\n        pass\n")
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
    trace.states[0]["rank_condition"] = {"frame": F.as_site(("train.py", 7, "train")),
                                         "condition": {"line": 2, "text": "if rank == 0:", "kind": "if"}}
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
        ("local_decision", [0], {"file": "/u/train.py", "line": 7, "function": "train"})]
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
