"""What a verdict rests on, the store or the ranks' own answers (issue 41): hand-built states and fingerprints, a fake
store protocol, no process. A forged fingerprint is refuted by the rank it describes; a verdict whose blocked ranks
did not answer themselves is reported and never acted on; incidents and alerts are budgeted."""

import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))

import factory as F  # noqa: E402
from factory import seed_states  # noqa: E402
from writer_fakes import OwnAnswer, Policy, StoreJob  # noqa: E402

from ddpwatch import analysis  # noqa: E402
from ddpwatch.analysis import confirm  # noqa: E402
from ddpwatch.config import Config  # noqa: E402
from ddpwatch.render.basis_words import basis_line, worded_basis  # noqa: E402
from ddpwatch.watch import incident_writer, throttle  # noqa: E402
from ddpwatch.watch.fingerprints import asked_positions  # noqa: E402
from ddpwatch.watch.incident_writer import IncidentWriter, RankIdentity  # noqa: E402

SUM, MAX = F.signature(), F.signature(reduce="max")


def fingerprints(per_rank: dict, first: int = 0) -> dict:
    return {
        rank: {"rank": rank, "fingerprints": F.fingerprints(rank, sigs, first=first)} for rank, sigs in per_rank.items()
    }


def store_mismatch():
    """What the store held: rank 1's document says MAX at position 1 where rank 0 did SUM (forged, or real)."""
    return analysis.completed_mismatches(fingerprints({0: [SUM, SUM], 1: [SUM, MAX]}), 2)


def writer_for(tmp_path, monkeypatch, own: dict, peers: dict):
    monkeypatch.setattr(incident_writer, "say", lambda text: None)
    job = StoreJob(peers)
    answers = OwnAnswer(job, own)
    stop = threading.Event()
    stop.set()  # no native stacks
    writer = IncidentWriter(
        job,
        Config(dir=str(tmp_path)),
        RankIdentity(0, 2, "node0", "t"),
        answers=answers,
        policy=Policy(),
        logged=set(),
        stopping=stop,
    )
    return writer, job, answers


def read_report(folder: str) -> dict:
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as handle:
        return json.load(handle)


# ---------------------------------------------------------------- completed mismatches: answered, or the store alone


def test_a_mismatch_the_answers_show_too_is_confirmed():
    found = store_mismatch()
    answers = fingerprints({0: [SUM, SUM], 1: [SUM, MAX]})
    again = analysis.completed_mismatches(answers, 2)
    assert confirm.completed(found.findings, again.fingerprint, found.fingerprint, answers) == (confirm.CONFIRMED, [])


def test_a_mismatch_the_rank_described_answers_otherwise_is_refuted():
    """The forger rewrote rank 1's document; rank 1's own answer holds SUM at that position."""
    found = store_mismatch()
    answers = fingerprints({0: [SUM, SUM], 1: [SUM, SUM]})
    again = analysis.completed_mismatches(answers, 2)
    assert confirm.completed(found.findings, again.fingerprint, found.fingerprint, answers) == (confirm.REFUTED, [])


def test_a_mismatch_a_rank_did_not_answer_for_is_unconfirmed_naming_it():
    found = store_mismatch()
    scrolled = fingerprints({0: [SUM, SUM]}) | fingerprints({1: [SUM]}, first=5)  # rank 1's answer starts later
    for answers in ({0: fingerprints({0: [SUM, SUM]})[0]}, scrolled):
        again = analysis.completed_mismatches(answers, 2)
        assert confirm.completed(found.findings, again.fingerprint, found.fingerprint, answers) == (
            confirm.UNCONFIRMED,
            [1],
        )


def test_an_incident_asks_each_answer_to_hold_the_positions_and_a_peers_ask_is_only_names_and_numbers():
    found = store_mismatch()
    assert confirm.asked_positions(found.findings) == {"0": 1}
    assert asked_positions({"since": {"0": 1}}) == {"0": 1}
    hostile = {"since": {"0": "1", "1": -4, "2": [1], "g" * 300: 1, **{str(i): i for i in range(3, 20)}}}
    assert asked_positions(hostile) == {str(i): i for i in range(3, 11)}  # bounded: 8 groups
    assert asked_positions({"since": "x"}) == asked_positions(None) == {}


def test_a_refuted_mismatch_writes_no_report_and_a_confirmed_one_says_so(tmp_path, monkeypatch):
    found = store_mismatch()
    mine = fingerprints({0: [SUM, SUM]})[0]
    writer, job, own = writer_for(tmp_path, monkeypatch, mine, fingerprints({1: [SUM, SUM]}))
    assert writer.write(found, None, {}, "report") is None  # rank 1 answered SUM: refuted
    assert job.infos[0]["since"] == {"0": 1} and own.asked == [{"0": 1}]
    assert not os.listdir(tmp_path)
    writer, job, _ = writer_for(tmp_path, monkeypatch, mine, fingerprints({1: [SUM, MAX]}))
    folder, _, action = writer.write(found, None, {}, "abort")
    assert action == "report"  # a reading: never acted on, however confirmed
    [finding] = read_report(folder)["findings"]
    assert finding["basis"]["confirmed"] is True and finding["basis"]["acts"] is False


# ---------------------------------------------------------------- facts: every blocked rank answered for itself


def test_a_deadlock_whose_blocked_peer_only_stood_in_from_the_store_is_reported_not_acted_on(tmp_path, monkeypatch):
    """Rank 1 did not answer: its state is the position the leader read from the store (which anyone on the port
    can write). The deadlock is reported; the abort is not carried out; the report says why."""
    states = seed_states(2)
    assessment = analysis.assess(states, 2, 0.5, 60.0, {})
    writer, job, _ = writer_for(tmp_path, monkeypatch, states[0], {})
    folder, _, action = writer.write(assessment, None, {1: states[1]}, "abort")
    assert action == "report"
    [finding] = read_report(folder)["findings"]
    assert finding["basis"]["confirmed"] is False and finding["basis"]["unconfirmed"] == [1]
    assert finding["basis"]["acts"] is False
    with open(os.path.join(folder, "report.txt"), encoding="utf-8") as handle:
        assert "Not confirmed by rank 1 in their own answers" in " ".join(handle.read().split())


def test_a_deadlock_every_rank_answered_for_itself_is_acted_on(tmp_path, monkeypatch):
    states = seed_states(2)
    assessment = analysis.assess(states, 2, 0.5, 60.0, {})
    writer, job, _ = writer_for(tmp_path, monkeypatch, states[0], {1: states[1]})
    folder, _, action = writer.write(assessment, None, {1: states[1]}, "abort")
    assert action == "abort"
    [finding] = read_report(folder)["findings"]
    assert finding["basis"]["confirmed"] is True and finding["basis"]["acts"] is True


def at_seq(state: dict, seq: int, **more) -> dict:
    """`state` waiting in its collective at position `seq` of its group."""
    return dict(state, inflight=[dict(state["inflight"][0], seq=seq)], **more)


def test_a_stand_in_whose_wait_is_behind_anothers_is_named_and_an_answered_one_or_a_silent_one_is_not():
    """Issue 43, a loaded run: rank 0 had moved on from seq 0 before its watchdog published again; rank 1, blocked
    at seq 12, read that position from the store and proved a deadlock that was not there."""
    states = seed_states(2)
    old, waiting = at_seq(states[0], 0, stale=True), at_seq(states[1], 12)
    assert confirm.stale_and_behind({0: old, 1: waiting}, {}, 0.5) == [0]
    assert confirm.stale_and_behind({0: dict(old, stale=False), 1: waiting}, {}, 0.5) == []  # its own answer
    assert confirm.stale_and_behind({0: old, 1: waiting}, {0: {"process": {"exists": True}}}, 0.5) == []  # silent
    assert confirm.stale_and_behind({0: at_seq(states[0], 12, stale=True), 1: waiting}, {}, 0.5) == []  # level
    assert confirm.stale_and_behind({0: at_seq(states[0], 12), 1: at_seq(states[1], 3, stale=True)}, {}, 0.5) == [1]
    other_group = dict(old, inflight=[dict(old["inflight"][0], group="7")])
    assert confirm.stale_and_behind({0: other_group, 1: waiting}, {}, 0.5) == []  # positions of another group
    p2p = dict(old, inflight=[dict(old["inflight"][0], peer=1, op="recv")])
    assert confirm.stale_and_behind({0: p2p, 1: waiting}, {}, 0.5) == []  # a pair's own count, not the group's


def test_a_deadlock_resting_on_a_stand_in_left_behind_is_not_written_and_its_claim_goes_back(tmp_path, monkeypatch):
    """The writer (rank 0) waits at seq 12; rank 1's position, read from the store, is at seq 3 and rank 1 does not
    answer: no report, and the claim is given back for whoever sees it next with the answers. Answered, it is
    written."""
    states = seed_states(2)
    mine, old = at_seq(states[0], 12), at_seq(states[1], 3)
    assessment = analysis.assess({0: mine, 1: old}, 2, 0.5, 60.0, {})
    assert assessment.verdict == analysis.DEADLOCK
    writer, job, _ = writer_for(tmp_path, monkeypatch, mine, {})
    assert writer.write(assessment, None, {1: old}, "report") is None
    assert job.released == [assessment.fingerprint] and not os.listdir(tmp_path)
    writer, job, _ = writer_for(tmp_path, monkeypatch, mine, {1: old})  # its own answer, the same position
    assert writer.write(assessment, None, {1: old}, "report") is not None
    assert not hasattr(job, "released")


def test_a_rank_that_cannot_answer_is_the_leaders_own_observation_not_an_unconfirmed_one():
    states = {0: dict(seed_states(2)[0]), 1: dict(seed_states(2)[1], stale=True)}
    assert confirm.unconfirmed_blocked(states, {}, 0.5) == [1]
    assert confirm.unconfirmed_blocked(states, {1: {"process": {"exists": False}}}, 0.5) == []  # gone: observed
    running = dict(states[1], inflight=[])
    assert confirm.unconfirmed_blocked({0: states[0], 1: running}, {}, 0.5) == []  # not placed blocked


def test_the_basis_words_say_which_the_verdict_rests_on():
    fact = {"status": "fact", "fact": "calls_never_match", "acts": True, "confirmed": True}
    assert "Confirmed by the ranks it describes" in basis_line(worded_basis(fact, "collective_mismatch"))
    store = dict(fact, confirmed=False, unconfirmed=[1, 2], acts=False)
    line = basis_line(worded_basis(store, "collective_mismatch"))
    assert "Not confirmed by ranks 1-2" in line and "never acted on" in line
    assert "onfirmed" not in basis_line(worded_basis({"status": "fact", "fact": "silent_rank"}, "dead_rank"))


# ---------------------------------------------------------------- budgets


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_rank_leads_a_burst_of_incidents_then_one_per_refill():
    clock = Clock()
    budget = throttle.IncidentThrottle(set(), clock)
    assert [budget.allow(True) for _ in range(throttle.BURST + 2)] == [True] * throttle.BURST + [False, False]
    clock.now += throttle.REFILL_S
    assert budget.allow(True) and not budget.allow(True)
    assert budget.held_back == 3


def test_readings_are_one_per_window_and_none_while_the_job_opens_many_but_facts_ignore_the_jobs_count():
    clock = Clock()
    budget = throttle.IncidentThrottle(set(), clock)
    assert budget.allow(False) and not budget.allow(False)
    clock.now += throttle.READING_EVERY_S
    for number in range(1, throttle.JOB_READINGS + 2):  # someone opens incidents: the job's counter climbs
        budget.saw_counter(number)
        clock.now += 1
    clock.now += throttle.REFILL_S
    assert not budget.allow(False)  # a reading waits while the job is flooded
    assert budget.allow(True)  # a fact does not: a forger cannot hide a real hang by raising the counter
    clock.now += throttle.READING_EVERY_S + 1
    budget.saw_counter(throttle.JOB_READINGS + 1)
    assert budget.allow(False)


def test_alerts_are_one_per_kind_per_window_and_say_how_many_were_held_back():
    clock = Clock()
    alerts = throttle.AlertThrottle(clock)
    assert alerts.allow("silent_mismatch") == (True, 0)
    assert alerts.allow("silent_mismatch") == (False, 0) and alerts.allow("silent_mismatch") == (False, 0)
    assert alerts.allow("collective_mismatch") == (True, 0)  # another kind: its own window
    clock.now += throttle.ALERT_EVERY_S
    assert alerts.allow("silent_mismatch") == (True, 2)


def test_an_incident_analysed_again_says_what_the_live_writer_said_of_each_rank():
    """`ddpwatch report --reanalyze`: the saved states' `stale` marks say which rank only stood in."""
    states = seed_states(2)
    findings = analysis.assess(states, 2, 0.5, 60.0, {}).findings
    [answered] = confirm.reread(findings, states, {}, 0.5)
    assert answered["basis"]["confirmed"] is True
    [stood_in] = confirm.reread(findings, {0: states[0], 1: dict(states[1], stale=True)}, {}, 0.5)
    assert stood_in["basis"]["unconfirmed"] == [1] and stood_in["basis"]["acts"] is False
    mismatch = store_mismatch().findings
    answers = fingerprints({0: [SUM, SUM], 1: [SUM, MAX]})
    [compared] = confirm.reread(mismatch, {0: answers[0], 1: dict(answers[1], stale=True)}, {}, 0.5)
    assert compared["basis"]["unconfirmed"] == [1]  # not blocked, but compared: its document was the store's
