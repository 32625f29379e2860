"""Collectives that complete without matching, on hand-built fingerprints and a live Recorder (no processes)."""

import sys

import pytest

import factory as F
from ddpwatch import analysis
from ddpwatch.analysis import silent
from ddpwatch.render import wording
from ddpwatch.watch import crashes, verdict
from ddpwatch.watch.fingerprints import FingerprintLog, MismatchCheck
from ddpwatch.capture.record import Recorder

A, B, C = ("train.py", 10, "step"), ("train.py", 20, "step"), ("train.py", 30, "step")


def compare(per_rank: dict) -> list:
    docs = {rank: F.fingerprints(rank, sigs) for rank, sigs in per_rank.items()}
    return silent.silent_mismatch(docs, len(docs)) + silent.crossed_collectives(docs, len(docs))


def kinds(found):
    return [f["kind"] for f in found]


# ---------------------------------------------------------------- what is a mismatch, and what is not


@pytest.mark.parametrize(
    "other, differs",
    [
        (F.signature(dtypes=("int32",)), ["dtype"]),
        (F.signature(counts=(8,)), ["count"]),
        (F.signature(reduce="max"), ["reduce"]),
        (F.signature(op="broadcast", reduce=None), ["collective"]),
        (F.signature(dtypes=("float16",), counts=(2,)), ["dtype", "count"]),
    ],
)
def test_each_field_that_must_agree_is_named(other, differs):
    [found] = compare({0: [F.signature()], 1: [other]})
    assert found["kind"] == "silent_mismatch" and found["facts"]["differs"] == differs
    assert found["ranks"] == [1] and found["facts"]["seq"] == 0


def test_equal_fingerprints_from_the_same_lines_are_silent():
    assert compare({0: [F.signature(site=A), F.signature(site=B)], 1: [F.signature(site=A), F.signature(site=B)]}) == []


def test_a_rank_conditional_branch_reaching_one_collective_from_two_lines_is_not_crossed():
    assert compare({0: [F.signature(site=A)] * 3, 1: [F.signature(site=B)] * 3}) == []


def test_the_same_lines_in_another_order_are_crossed_with_each_ranks_order():
    [found] = compare({0: [F.signature(site=A), F.signature(site=B)], 1: [F.signature(site=B), F.signature(site=A)]})
    assert found["kind"] == "crossed_collectives" and found["facts"]["positions"] == 2
    assert [[s["line"] for s in o["sites"]] for o in found["facts"]["orders"]] == [[10, 20], [20, 10]]
    assert "sorted" in wording.worded(found)["fix"]


def test_one_line_shared_by_a_crossing_and_a_branch_is_not_crossed():
    """Rank 0 passes A then B, rank 1 B then C: different lines, not the same lines reordered."""
    assert compare({0: [F.signature(site=A), F.signature(site=B)], 1: [F.signature(site=B), F.signature(site=C)]}) == []


def test_all_to_all_and_object_collectives_may_differ_in_counts():
    uneven = compare(
        {
            0: [F.signature(op="all_to_all", reduce=None, counts=(2,))],
            1: [F.signature(op="all_to_all", reduce=None, counts=(3,))],
        }
    )
    objects = compare(
        {
            0: [F.signature(op="all_gather", reduce=None, counts=(40,), region="object_collective")],
            1: [F.signature(op="all_gather", reduce=None, counts=(90,), region="object_collective")],
        }
    )
    assert uneven == [] and objects == []


def test_only_the_positions_both_ranks_published_are_compared():
    docs = {
        0: F.fingerprints(0, [F.signature()] * 4, first=0),
        1: F.fingerprints(1, [F.signature(reduce="max")], first=10),
    }
    assert silent.silent_mismatch(docs, 2) == []
    docs[1] = F.fingerprints(1, [F.signature(reduce="max")], first=3)
    [found] = silent.silent_mismatch(docs, 2)
    assert found["facts"]["seq"] == 3


def test_three_ranks_are_grouped_by_what_they_called_and_the_minority_is_the_culprit():
    [found] = compare({0: [F.signature()], 1: [F.signature(reduce="max")], 2: [F.signature(reduce="max")]})
    assert [side["ranks"] for side in found["facts"]["sides"]] == [[0], [1, 2]] and found["ranks"] == [0]


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        {"v": 2, "groups": {}},
        {"v": 1, "groups": {"0": "x"}},
        {"v": 1, "groups": {"0": {"first": 0, "ids": ["a", None, 7]}}, "signatures": {}},
        {"v": 1, "groups": {"0": {"first": 0, "ids": [0]}}, "signatures": {"0": "x"}},
    ],
)
def test_a_malformed_document_compares_as_nothing(doc):
    docs = {0: F.fingerprints(0, [F.signature()]), 1: doc}
    assert silent.silent_mismatch(docs, 2) == [] and silent.crossed_collectives(docs, 2) == []


def test_the_incident_says_when_it_formed_and_reanalysis_finds_it_again():
    trace = F.trace_float_against_int()
    assessment = analysis.assess(trace.states, 2, 0.5, 300.0)
    assert assessment.verdict == analysis.MISMATCH and assessment.fingerprint.startswith("mismatch-silent_mismatch-0-")
    summary = wording.worded(assessment.findings[0])["summary"]
    assert "12 DDP steps in epoch 2" in summary and "int32" in summary and "float32" in summary


def _mismatch_at(first: int, dtype: str = "int32", site=F.LOSS, crossed: bool = False) -> analysis.Assessment:
    """Two ranks' documents holding one mismatch at position `first` + 1 (a dtype, or two crossed lines)."""
    if crossed:
        loss, hist = F.signature(site=F.LOSS), F.signature(site=F.HIST)
        mine, theirs = [loss, hist], [hist, loss]
    else:
        mine, theirs = [F.signature(site=site)], [F.signature(dtypes=(dtype,), site=site)]
    docs = {
        0: F.fingerprints(0, [F.signature(), *mine], first=first),
        1: F.fingerprints(1, [F.signature(), *theirs], first=first),
    }
    return analysis.completed_mismatches({rank: {"fingerprints": doc} for rank, doc in docs.items()}, 2)


@pytest.mark.parametrize("crossed", [False, True])
def test_a_mismatch_recurring_at_later_positions_is_the_same_incident_not_a_report_a_round(crossed):
    """A mismatch inside a training loop recurs every step: one report, not one each watchdog round (a real run of
    a crossed pair every step wrote 5 reports in 7 s, each at a later position)."""
    first, later = _mismatch_at(3, crossed=crossed), _mismatch_at(4003, crossed=crossed)
    assert first.verdict == later.verdict == analysis.MISMATCH
    assert first.findings[0]["facts"] != later.findings[0]["facts"]  # other positions ...
    assert first.fingerprint == later.fingerprint  # ... one incident


def test_a_mismatch_of_another_kind_or_at_another_line_is_a_new_incident():
    reference = _mismatch_at(3).fingerprint
    assert _mismatch_at(3, dtype="float64").fingerprint == reference  # what differs is still the dtype
    assert _mismatch_at(3, site=F.HIST).fingerprint != reference  # another line
    assert _mismatch_at(3, crossed=True).fingerprint != reference  # another kind


def test_a_hang_is_still_the_verdict_when_the_ranks_also_carry_fingerprints():
    trace = F.trace_lone_barrier()
    for rank, state in trace.states.items():
        state["fingerprints"] = F.fingerprints(rank, [F.signature(reduce="max" if rank else "sum")])
    assert analysis.assess(trace.states, trace.world_size, 0.5, 300.0).verdict == analysis.DEADLOCK


# ---------------------------------------------------------------- the live side: the log the watchdog keeps


def _complete(recorder, op="all_reduce", group="0", shape=(4,), dtype="torch.float32", reduce=None):
    record = recorder.begin(op, op, group, ((shape, dtype),), sys._getframe())
    if reduce is not None:
        record.reduce = reduce
    recorder.finish(record)
    return record


def test_the_log_files_completed_positions_once_and_waits_for_those_in_flight():
    recorder = Recorder()
    log = FingerprintLog(recorder)
    _complete(recorder)
    pending = recorder.begin("all_reduce", "all_reduce", "0", (((4,), "torch.float32"),), sys._getframe())
    recorder.begin("send", "send", "0", (), sys._getframe(), peer=1)  # point-to-point: analysis/p2p.py's
    log.collect()
    assert log.document()["groups"]["0"]["ids"] == [0]
    recorder.finish(pending)
    for _ in range(40):
        _complete(recorder, shape=(8,))
    log.collect()
    doc = log.document()
    group = doc["groups"]["0"]
    assert group["first"] == 0 and len(group["ids"]) == 42  # the one in flight filed once it completed
    assert [doc["signatures"][str(i)]["counts"] for i in group["ids"][:2]] == [[4], [4]]
    assert doc["signatures"][str(group["ids"][-1])]["counts"] == [8]
    assert doc["signatures"]["0"]["site"]["function"] == "_complete"  # the line that called the collective


def test_the_reduce_op_kept_on_the_record_is_published_by_name():
    import torch.distributed as dist

    recorder = Recorder()
    _complete(recorder, reduce=dist.ReduceOp.MAX)
    log = FingerprintLog(recorder)
    log.collect()
    assert log.document()["signatures"]["0"]["reduce"] == "max"


class _Job:
    def __init__(self, docs):
        self.docs, self.asked = docs, []

    def fingerprints(self, ranks):
        self.asked.append(list(ranks))
        return {r: self.docs[r] for r in ranks if r in self.docs}


def test_the_check_reads_one_partner_per_group_and_reports_a_mismatch_once():
    recorder = Recorder()
    recorder.note_group("0", None, True)
    recorder.note_group("evens", [0, 2], True)
    _complete(recorder)
    _complete(recorder, group="evens")
    check = MismatchCheck(FingerprintLog(recorder), 2, 4, lambda: recorder.groups)
    assert check.outgoing() is not None and check.outgoing() is None  # nothing new: the last one stands
    assert check.partners() == [0]  # the lowest other rank of "0" and of "evens"
    theirs = F.fingerprints(0, [F.signature(dtypes=("int32",), counts=(4,), reduce=None)])
    job, reported = _Job({0: theirs}), set()
    assessment, stand_ins = check.look(job, reported)
    assert assessment.findings[0]["kind"] == "silent_mismatch" and stand_ins[0]["fingerprints"] is theirs
    assert check.look(job, reported) is None  # the same documents: not compared again, not said again


def test_a_peer_never_acts_on_a_verdict_for_a_completed_mismatch_or_one_carried_out_as_a_report():
    """Collectives that completed without matching are a reading (issue 40): whatever a posted verdict claims, a
    peer configured to abort does not end itself on one, nor on any verdict its writer carried out as a report."""
    posted = {"action": "abort", "mismatch": {"group": "0", "seq": 5}, "positions": {}}
    assert "reading" in verdict.why_not_act(posted, "abort", {"last_seq": {"0": 7}}, 1, 0.5, 300.0)
    hang = {"action": "report", "positions": {"-": [[0, 1]]}}
    assert "reading" in verdict.why_not_act(hang, "abort", {"idle_s": 999.0}, 1, 0.5, 300.0)
    assert verdict.why_not_act(dict(hang, action="abort"), "abort", {"idle_s": 999.0}, 1, 0.5, 300.0) is None


# ---------------------------------------------------------------- the crash: a fault file read back

FAULT = """Fatal Python error: Aborted

Thread 0x00007f92963106c0 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/ddpwatch/watch/watchdog.py", line 97 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner

Thread 0x00007f92b9aadb80 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/u/metrics.py", line 10 in log_loss
  File "/u/train.py", line 30 in <module>

Extension modules: torch._C (total: 1)
"""


def test_a_fault_file_reads_back_as_stacks_with_the_main_thread_first(tmp_path):
    path = tmp_path / "job-rank-0.txt"
    path.write_text(FAULT)
    fault = crashes.read_fault(str(path))
    assert fault["error"] == "Aborted"
    main = fault["stacks"][0]
    assert main["main"] and [f["function"] for f in main["frames"]] == ["<module>", "log_loss", "all_reduce"]
    (tmp_path / "empty.txt").write_text("")
    assert crashes.read_fault(str(tmp_path / "empty.txt")) is None
    assert crashes.read_fault(str(tmp_path / "missing.txt")) is None


def test_the_crash_names_both_lines_and_says_the_dead_ranks_sizes_are_unknown():
    trace = F.trace_mismatch_crash()
    [found] = analysis.assess(trace.states, 2, 0.5, 300.0, trace.silent).findings
    words = wording.worded(found)
    assert found["kind"] == "mismatch_crash" and found["location"]["function"] == "log_loss"
    assert "log_hist()" in words["summary"] and "8 float32" in words["summary"] and "not known" in words["summary"]


def test_a_survivor_whose_collective_has_not_failed_yet_still_names_both_lines():
    """torchrun's SIGTERM can reach the survivor before gloo raised in its all_reduce: it still waits in it."""
    trace = F.trace_mismatch_crash()
    [failed] = [r for r in trace.states[1]["recent"] if r["state"] == "failed"]
    trace.states[1]["recent"].remove(failed)
    trace.states[1]["inflight"] = [dict(failed, state="in_flight", error=None)]
    [found] = analysis.assess(trace.states, 2, 0.5, 300.0, trace.silent).findings
    words = wording.worded(found)
    assert found["kind"] == "mismatch_crash" and found["location"]["function"] == "log_loss"
    assert "log_hist()" in words["summary"] and "8 float32" in words["summary"]


def test_without_a_fault_file_a_vanished_rank_is_a_dead_rank_as_before():
    trace = F.trace_mismatch_crash()
    del trace.silent[0]["fault"]
    trace.states[1].update(inflight=[F.rec(4, "barrier", age=20.0)], idle_s=20.0)
    assert kinds(analysis.assess(trace.states, 2, 0.5, 300.0, trace.silent).findings) == ["dead_rank"]


def test_compared_positions_counts_what_a_comparison_looked_at():
    """A silent result means something only where positions were compared (issue 43)."""
    from ddpwatch.analysis import silent

    same = {0: F.fingerprints(0, [F.signature()] * 3), 1: F.fingerprints(1, [F.signature()] * 3)}
    assert silent.compared_positions(same) == 3
    apart = {0: F.fingerprints(0, [F.signature()] * 3), 1: F.fingerprints(1, [F.signature()] * 3, first=10)}
    assert silent.compared_positions(apart) == 0


# ---------------------------------------------------------------- ranks whose positions are the reference's own


def _pair_by_pair(docs: dict, same_as_reference: bool = False):
    """silent._compared before ranks equal to the reference were left out: every pair read and compared."""
    usable = {rank: doc for rank, doc in docs.items() if silent._usable(doc)}
    for group in sorted({group for doc in usable.values() for group in doc["groups"]}):
        logs = {rank: silent._positions(doc, group) for rank, doc in sorted(usable.items())}
        logs = {rank: log for rank, log in logs.items() if log}
        if len(logs) < 2:
            continue
        reference, *others = sorted(logs)
        for other in others:
            common = sorted(set(logs[reference]) & set(logs[other]))
            if common:
                yield group, reference, other, [(seq, logs[reference][seq], logs[other][seq]) for seq in common]


def _random_docs(rng) -> dict:
    """A job's fingerprint documents, most ranks publishing the same positions (each its own copy, as decoded from
    the store), some changed: a field, two sites swapped, a group missing or shifted, Join's unaligned numbering."""
    import copy

    sites = [A, B, C]
    base = [
        F.signature(site=rng.choice(sites), dtypes=(rng.choice(["float32", "int64"]),), counts=(rng.choice([4, 8]),))
        for _ in range(rng.randint(1, 6))
    ]
    docs = {}
    for rank in range(rng.randint(2, 12)):
        sigs = copy.deepcopy(base)
        doc = F.fingerprints(rank, sigs, first=rng.choice([0, 0, 0, 1]))
        change = rng.random()
        if change < 0.15:
            sigs[rng.randrange(len(sigs))]["dtypes"] = ["float16"]
            doc = F.fingerprints(rank, sigs)
        elif change < 0.3 and len(sigs) > 1:
            i, j = rng.sample(range(len(sigs)), 2)
            sigs[i]["site"], sigs[j]["site"] = sigs[j]["site"], sigs[i]["site"]
            doc = F.fingerprints(rank, sigs)
        elif change < 0.4:
            doc["groups"]["1"] = copy.deepcopy(doc["groups"]["0"])
        elif change < 0.5:
            doc["groups"]["0"]["unaligned_from"] = rng.randint(0, len(sigs))
        elif change < 0.55:
            doc["groups"] = {}
        elif change < 0.6:
            doc = {"v": 99}
        docs[rank] = doc
    return docs


def test_leaving_out_the_ranks_equal_to_the_reference_finds_exactly_what_comparing_every_pair_finds(monkeypatch):
    import random

    rng = random.Random(45)
    kinds_seen = set()
    for _ in range(400):
        docs = _random_docs(rng)
        found = (
            silent.silent_mismatch(docs, len(docs)),
            silent.crossed_collectives(docs, len(docs)),
            silent.compared_positions(docs),
        )
        with monkeypatch.context() as patched:
            patched.setattr(silent, "_compared", _pair_by_pair)
            expected = (
                silent.silent_mismatch(docs, len(docs)),
                silent.crossed_collectives(docs, len(docs)),
                silent.compared_positions(docs),
            )
        assert found == expected, docs
        kinds_seen.update(f["kind"] for f in found[0] + found[1])
    assert kinds_seen == {"silent_mismatch", "crossed_collectives"}, "the cases reach both findings"


def test_ranks_publishing_the_reference_positions_are_read_once_and_compared_with_nothing(monkeypatch):
    """512 ranks, every one's positions the same (each its own copy): counted, not timed."""
    import copy

    sigs = [F.signature(site=A), F.signature(site=B)] * 30
    docs = {rank: F.fingerprints(rank, copy.deepcopy(sigs)) for rank in range(512)}
    docs[300] = F.fingerprints(300, sigs[:-1] + [F.signature(site=B, dtypes=("int64",))])
    calls = {"differences": 0, "positions": 0}
    real_differences, real_positions = silent.differences, silent._positions

    def counted(name, real):
        def call(*args):
            calls[name] += 1
            return real(*args)

        return call

    monkeypatch.setattr(silent, "differences", counted("differences", real_differences))
    monkeypatch.setattr(silent, "_positions", counted("positions", real_positions))
    [found] = silent.silent_mismatch(docs, 512)
    assert found["ranks"] == [300] and found["facts"]["seq"] == 59
    assert calls == {"differences": 60, "positions": 2}, calls
    assert silent.compared_positions(docs) == 511 * 60
