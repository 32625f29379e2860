"""What an outsider writes into the job's store, and what another job leaves in the temp folder (issue 41), without a
process: fingerprint documents checked and bounded before they are compared, keys someone deleted never waited for,
names read from the store never path parts unless they are ddpwatch's shape, fault files named per job and swept."""

import copy
import json
import logging
import os
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import factory as F  # noqa: E402

from ddpwatch import analysis  # noqa: E402
from ddpwatch.format import validate  # noqa: E402
from ddpwatch.watch import crashes  # noqa: E402
from ddpwatch.watch import store as store_module  # noqa: E402
from ddpwatch.watch.store import JobProtocol, StateStore  # noqa: E402

WORLD = 2
GOOD = F.fingerprints(1, [F.signature(), F.signature(reduce="max", root=["group", 0])])
HOSTILE = ["x", 10**30, -5, 1.5, None, True, [], [[0]], {}, {"a": 1}, "\x1b[2J"]


def leaves(doc, path=()):
    """Every (path, value) of a JSON document, containers included."""
    yield path, doc
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from leaves(value, path + (key,))


def replaced(doc, path, value):
    if not path:
        return value
    mutant = copy.deepcopy(doc)
    parent = mutant
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return mutant


def mutants():
    for path, _ in leaves(GOOD):
        for value in HOSTILE:
            yield path, replaced(GOOD, path, value)


def compare(doc):
    reference = F.fingerprints(0, [F.signature(), F.signature()])
    return analysis.completed_mismatches({0: {"fingerprints": reference}, 1: {"fingerprints": doc}}, WORLD)


def test_every_malformed_document_is_refused_or_compared_without_raising():
    """Each leaf of a published document replaced by each hostile value (447 documents). Unchecked, some of them
    raise inside the comparison (this counts them: the check below can fail); checked first, none reaches it
    that would."""
    raised_unchecked, refused = 0, 0
    for _, mutant in mutants():
        try:
            compare(mutant)
        except Exception:
            raised_unchecked += 1
        if validate.fingerprint_problem(mutant, WORLD) is not None:
            refused += 1
            continue
        compare(mutant)  # passed the check: must compare without raising
    assert raised_unchecked > 0, "no mutant breaks the comparison: this test would not notice a missing check"
    assert refused > raised_unchecked
    assert validate.fingerprint_problem(GOOD, WORLD) is None


@pytest.fixture
def job(caplog):
    import torch.distributed as dist

    caplog.set_level(logging.WARNING, logger="ddpwatch")
    return JobProtocol(StateStore(dist.HashStore(), "test"), 3)


def lines(caplog, words):
    return [r for r in caplog.records if words in r.getMessage()]


def test_a_bad_document_is_left_out_with_one_line_once_and_the_others_are_still_read(job, caplog):
    store = job.store._store
    store.set(job.store.key("fp", 1), json.dumps(dict(GOOD, groups={"0": {"first": "a", "ids": [0]}})))
    store.set(job.store.key("fp", 2), json.dumps(dict(GOOD, rank=2)))
    for _ in range(3):
        assert list(job.fingerprints([1, 2])) == [2]
    [line] = lines(caplog, "left out the fp document")
    assert "rank 1's key" in line.getMessage() and "groups" in line.getMessage()
    assert "Traceback" not in caplog.text


def test_a_document_over_its_size_bound_is_left_out_unparsed(job, caplog, monkeypatch):
    parsed = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: parsed.append(len(text)) or loads(text))
    huge = json.dumps(dict(GOOD, pad="x" * store_module.FINGERPRINTS_MAX_BYTES))
    job.store._store.set(job.store.key("fp", 1), huge)
    assert job.fingerprints([1]) == {}
    assert parsed == []  # never handed to the parser
    [line] = lines(caplog, "left out the fp document")
    assert "over the" in line.getMessage()


class NoWaiting:
    """A store on which any read that waits for a key fails the test (someone deleted the key since its check)."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name in ("get", "multi_get", "wait"):
            raise AssertionError(f"{name} waits for a key that may be gone")
        return getattr(self._store, name)


def test_a_document_someone_deleted_is_not_waited_for(job):
    job.store._store.set(job.store.key("fp", 1), json.dumps(GOOD))
    assert list(job.fingerprints([1])) == [1]
    job.store._store.delete_key(job.store.key("fp", 1))
    job.store._store = NoWaiting(job.store._store)
    assert job.fingerprints([1]) == {}


def test_a_name_read_from_the_store_becomes_a_path_part_only_in_ddpwatchs_shape(caplog):
    import torch.distributed as dist

    caplog.set_level(logging.WARNING, logger="ddpwatch")
    for forged, used in (("../../../tmp/x", "mine"), ("20260101-000000", "20260101-000000")):
        shared = StateStore(dist.HashStore(), "test")
        shared._store.set(shared.key("stamp"), forged)
        proposal = "20261206-120000"
        assert shared.agree("stamp", proposal, store_module.STAMP) == (proposal if used == "mine" else used)
    assert len(lines(caplog, "not a value ddpwatch writes there")) == 1
    fresh = StateStore(dist.HashStore(), "test")
    token = fresh.agree("job", "0123456789abcdef", store_module.JOB_TOKEN)
    assert token == "0123456789abcdef" == fresh.agree("job", "fedcba9876543210", store_module.JOB_TOKEN)


# ---------------------------------------------------------------- fault files: per job, swept


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_two_jobs_started_in_the_same_second_have_their_own_fault_files(private_tmp):
    a = crashes.fault_path("aaaaaaaaaaaaaaaa", 1, 100)
    b = crashes.fault_path("bbbbbbbbbbbbbbbb", 1, 200)
    assert a != b and "aaaaaaaaaaaaaaaa-rank-1-pid-100" in a
    for path in (a, b):
        with open(path, "w") as handle:
            handle.write(path)
    assert crashes.find_fault("aaaaaaaaaaaaaaaa", 1) == a and crashes.find_fault("bbbbbbbbbbbbbbbb", 1) == b
    assert crashes.find_fault("aaaaaaaaaaaaaaaa", 0) is None


def dead_pid() -> int:
    """A pid no process has: above the largest pid_max Linux allows (2**22)."""
    return 2**22 + 7


def test_the_sweep_removes_the_files_of_processes_gone_and_keeps_live_and_recent_ones(private_tmp):
    gone, now = dead_pid(), time.time()
    made = {
        "dead_old": (crashes.fault_path("aaaaaaaaaaaaaaaa", 0, gone), crashes.SWEEP_AFTER_S + 1),
        "dead_recent": (crashes.fault_path("aaaaaaaaaaaaaaaa", 1, gone), 5),  # a survivor may still read it
        "live_old": (crashes.fault_path("bbbbbbbbbbbbbbbb", 0, os.getpid()), crashes.SWEEP_AFTER_S + 1),
        "old_naming": (
            os.path.join(os.path.dirname(crashes.fault_path("", 0, 0)), "20260101-000000-rank-3.txt"),
            10**5,
        ),
        "not_ours": (os.path.join(os.path.dirname(crashes.fault_path("", 0, 0)), "notes.txt"), 10**5),
    }
    for path, age in made.values():
        with open(path, "w"):
            pass
        os.utime(path, (now - age, now - age))
    assert crashes.sweep(now) == 2
    assert {name for name, (path, _) in made.items() if os.path.exists(path)} == {"dead_recent", "live_old", "not_ours"}


def test_any_value_over_the_bound_is_left_out_unparsed_with_one_line(job, caplog, monkeypatch):
    parsed = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: parsed.append(len(text)) or loads(text))
    job.store._store.set(job.store.key("pos", 1), json.dumps({"rank": 1, "pad": "x" * store_module.MAX_VALUE_BYTES}))
    job.store._store.set(job.store.key("pos", 2), json.dumps({"rank": 2}))
    for _ in range(2):
        assert list(job.positions([1, 2])) == [2]
    assert all(size < store_module.MAX_VALUE_BYTES for size in parsed)  # the big one never reached the parser
    assert len(lines(caplog, "left out 1 value(s)")) == 1


def test_a_store_that_cannot_add_is_one_line_once_and_no_traceback(caplog):
    """Issue 43: torch's FakeStore (its own tests use it, and so do people benchmarking) made every guard() print
    "could not start the watchdog" with a full traceback."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import ddpwatch
    from ddpwatch import session

    session._SAID.clear()
    caplog.set_level(logging.INFO, logger="ddpwatch")
    for _ in range(2):
        with ddpwatch.guard():
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
            dist.destroy_process_group()
    said = [r for r in caplog.records if r.name == "ddpwatch" and r.levelno >= logging.WARNING]
    assert [r.getMessage()[:49] for r in said] == ["ddpwatch: no watchdog: the job's store cannot add"]
    assert not any(r.exc_info for r in caplog.records)
