"""Real 2-rank gloo runs of control flow that departs on one rank (tests/scenarios/departures.py): early stopping on a
local validation loss (also without a DataLoader), a NaN check that returns (also in a helper), an
exception caught with `continue` (also hidden until the loop ends), a crash handler that broadcasts, a metric helper
that returns on an empty shard. Hard time limits."""

import os

import pytest

from ranks import SCENARIOS, describe, load_only_report, run_case, tagged_line

from ddpwatch.analysis import incident as incident_module

DEPARTURES = os.path.join(SCENARIOS, "departures.py")
pytestmark = pytest.mark.timeout(120)


def finding_of(tmp_path, case):
    results = run_case([DEPARTURES, case], 2, tmp_path, DDPWATCH_ACTION="abort")
    assert all(r.returncode == 3 for r in results), describe(results)
    incident = load_only_report(tmp_path)
    assert len(incident["findings"]) == 1, (incident["findings"], describe(results))
    return incident, incident["findings"][0]


def line(tag):
    return tagged_line(DEPARTURES, tag)


def test_early_stopping_on_a_local_validation_loss_is_a_local_decision_of_the_rank_that_broke(tmp_path):
    incident, finding = finding_of(tmp_path, "early_stop")
    assert finding["kind"] == "local_decision"
    assert finding["ranks"] == [0]  # the rank that left, not rank 1, which trains on as it should
    assert finding["location"]["line"] == line("early_break")
    departure = finding["evidence"]["departure"]
    assert departure["condition"]["text"] == "if stopper.should_stop(val_loss):"
    assert departure["condition"]["line"] == line("early_condition")
    assert departure["proof"]["rule"] == "began_more"  # equal steps per epoch; rank 1 began one more epoch
    assert "all_reduce" in finding["fix"] and "broadcast" in finding["fix"]
    assert "DistributedSampler" not in finding["fix"]
    # the incident keeps what it was decided from: read again anywhere, it says the same
    again = incident_module.reanalyze(incident)
    assert [(f["kind"], f["ranks"]) for f in again["findings"]] == [("local_decision", [0])]


def test_a_nan_check_that_returns_on_one_rank_is_a_local_decision(tmp_path):
    _, finding = finding_of(tmp_path, "nan_return")
    assert finding["kind"] == "local_decision"
    assert finding["ranks"] == [1]
    assert finding["location"]["line"] == line("nan_return")
    assert finding["location"]["function"] == "train_until_nan"
    assert finding["evidence"]["departure"]["condition"]["text"] == "if not torch.isfinite(loss):"
    assert "all_reduce" in finding["fix"]


def test_an_exception_caught_with_continue_that_skips_backward_is_a_caught_exception(tmp_path):
    _, finding = finding_of(tmp_path, "caught")
    assert finding["kind"] == "caught_exception"
    assert finding["ranks"] == [1]  # the rank whose batch raised, not both
    assert finding["location"]["line"] == line("caught_except")
    assert f"backward() at departures.py:{line('caught_backward')}" in finding["summary"]
    assert finding["fix"].startswith("Skip together")


def test_a_break_out_of_loops_over_range_without_a_dataloader_is_a_local_decision(tmp_path):
    _, finding = finding_of(tmp_path, "counted_stop")
    assert (finding["kind"], finding["ranks"]) == ("local_decision", [1])
    assert finding["location"]["line"] == line("counted_break")
    proof = finding["evidence"]["departure"]["proof"]
    assert proof == {"rule": "counted", "loops": ["for step in range(3):", "for epoch in range(EPOCHS):"]}
    assert "DistributedSampler" not in finding["fix"]


def test_an_except_handler_that_broadcasts_on_the_failing_rank_is_a_caught_exception_at_the_except(tmp_path):
    _, finding = finding_of(tmp_path, "handler")
    assert (finding["kind"], finding["ranks"]) == ("caught_exception", [1])
    assert finding["location"]["line"] == line("handler_except")
    assert finding["evidence"]["departure"]["proof"]["rule"] == "in_handler"
    assert "all_reduce a flag" in finding["fix"] and "every rank" in finding["fix"]


def test_a_helper_returning_early_on_an_empty_shard_is_the_decision_of_the_rank_that_went_past_its_sync(tmp_path):
    _, finding = finding_of(tmp_path, "empty_shard")
    assert (finding["kind"], finding["ranks"]) == ("local_decision", [1])  # not rank 0, which waits in the sync
    assert finding["location"]["line"] == line("empty_return")
    assert finding["location"]["function"] == "epoch_metric"
    assert finding["evidence"]["departure"]["proof"]["rule"] == "passed_by"


def test_a_caught_exception_hidden_until_the_loop_ends_by_a_model_without_buffers_is_still_named(tmp_path):
    _, finding = finding_of(tmp_path, "skip_unbuffered")
    assert (finding["kind"], finding["ranks"]) == ("caught_exception", [1])
    assert finding["location"]["line"] == line("unbuffered_except")
    proof = finding["evidence"]["departure"]["proof"]
    assert proof["rule"] == "equal_lengths" and proof["length"] == 4 and proof["skipped"] is True


def test_a_continue_on_a_helpers_none_is_located_at_the_helpers_return(tmp_path):
    _, finding = finding_of(tmp_path, "helper_none")
    assert (finding["kind"], finding["ranks"]) == ("local_decision", [1])
    assert finding["location"]["line"] == line("helper_return")
    assert finding["location"]["function"] == "training_step"
    departure = finding["evidence"]["departure"]
    assert departure["exit"]["line"] == line("helper_continue")
    assert departure["condition"]["line"] == line("helper_condition")


def test_a_rank_that_broke_out_and_went_on_through_a_collective_it_completed_alone_is_still_named(tmp_path):
    _, finding = finding_of(tmp_path, "stop_then_empty_reduce")
    assert (finding["kind"], finding["ranks"]) == ("local_decision", [0])
    assert finding["location"]["line"] == line("ahead_break")
    assert finding["evidence"]["sequence"]["seq"] < finding["facts"]["record"]["seq"]


def test_a_loop_that_breaks_on_stop_iteration_is_uneven_inputs_on_the_rank_with_more_batches(tmp_path):
    """`while True: try: x = next(it) except StopIteration: break` with one more batch on rank 0: its data ran out
    on rank 1, no error was swallowed there (issue 40: it was caught_exception on rank 1). The deadlock is the fact
    the abort rests on; the cause is a reading, and the report says so."""
    incident, finding = finding_of(tmp_path, "manual_next")
    assert finding["kind"] == "uneven_inputs"
    assert finding["ranks"] == [0]  # the rank with the extra batch
    assert finding["location"]["line"] == line("manual_backward")
    assert "DistributedSampler" in finding["fix"] or "join" in finding["fix"]
    assert (finding["basis"]["status"], finding["basis"]["fact"], finding["basis"]["acts"]) == (
        "explained",
        "calls_never_match",
        True,
    )


def test_a_per_rank_budget_over_an_endless_generator_stream_is_the_decision_of_the_rank_that_left(tmp_path):
    """Issue 42 (b): `for x in stream(shard)` over `def stream(shard): while True: yield from shard`, left by rank 1's
    own wall-clock budget. Before: uneven_inputs naming rank 0 (the one still training) with the DistributedSampler
    fix, everything backwards. The stream cannot run out (read from the source, and the report says so)."""
    _, finding = finding_of(tmp_path, "wall_clock_budget")
    assert (finding["kind"], finding["ranks"]) == ("local_decision", [1])
    assert finding["location"]["line"] == line("budget_break")
    departure = finding["evidence"]["departure"]
    assert departure["condition"]["line"] == line("budget_condition")
    assert departure["proof"]["rule"] == "endless"
    assert "all_reduce" in finding["fix"] or "broadcast" in finding["fix"]
    assert "DistributedSampler" not in finding["fix"]
    assert "ends only by an exit" in finding["summary"] and "(Read from the source.)" in finding["summary"]


def test_a_budget_over_a_stream_bound_to_a_name_is_observed_in_the_generator_the_rank_still_holds(tmp_path):
    """`batches = stream(shard)`, `for x in batches:`: the header names no generator, so the source cannot say the loop
    never ends; the rank that left still holds `batches`, suspended, and that is read from its frame at the incident."""
    _, finding = finding_of(tmp_path, "named_stream")
    assert (finding["kind"], finding["ranks"]) == ("local_decision", [1])
    assert finding["location"]["line"] == line("named_break")
    proof = finding["evidence"]["departure"]["proof"]
    assert (proof["rule"], proof["basis"], proof["name"]) == ("not_ended", "observed", "batches")
    assert "(Observed in the run: the iterator its own frame held" in finding["summary"]


def test_a_named_iterator_that_ran_out_on_one_rank_is_uneven_inputs_on_the_rank_with_the_extra_batch(tmp_path):
    incident, finding = finding_of(tmp_path, "named_iterator_runs_out")
    assert (finding["kind"], finding["ranks"]) == ("uneven_inputs", [0])
    [held] = [it for state in incident["ranks"] if state["rank"] == 1 for it in state.get("iterators") or ()]
    assert (held["name"], held["kind"], held["ended"]) == ("batches", "list_iterator", True)  # observed: it ran out
