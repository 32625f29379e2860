"""Real 2-rank gloo runs of control flow that departs on one rank (tests/scenarios/departures.py): early stopping on a
local validation loss, a NaN check that returns, an exception caught with `continue`. Hard time limits."""

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
