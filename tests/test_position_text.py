"""A position's text in the store (watch/position_text.py): what the leader reads is what a whole decode reads."""

from __future__ import annotations

import json
import random

import pytest

from ddpwatch.watch import position_text as text
from ddpwatch.watch.store import _with_beat, position

WORLD = 16


def state(rank: int, line: int = 88, records: int = 1, **more) -> dict:
    """A rank's state as the watchdog publishes it while it waits (its own pid, host, start and age)."""
    site = {"file": "/u/train.py", "line": line, "function": "train"}
    inflight = [
        {
            "seq": 11 + i,
            "group": "0",
            "op": "barrier" if i == 0 else "all_reduce",
            "api": "barrier",
            "shapes": [],
            "dtypes": [],
            "site": site,
            "region": None,
            "start": 1_700_000_000.0 + rank + i,
            "age_s": 3.0 + rank / 100,
            "duration_s": None,
            "state": "in_flight",
            "error": None,
            "thread": "MainThread",
        }
        for i in range(records)
    ]
    frames = [{"file": "/u/train.py", "line": line, "function": "train", "internal": False}]
    return {
        "rank": rank,
        "pid": 100 + rank,
        "host": f"node{rank // 8}",
        "beat": 5 + rank,
        "status": "running",
        "progress": 1,
        "idle_s": 3.0 + rank / 100,
        "groups": {"0": None},
        "inflight": inflight,
        "stacks": [{"thread": "MainThread", "main": True, "frames": frames}],
        "recent": [],  # left out of a position
        **more,
    }


def published(doc: dict) -> bytes:
    """The text JobProtocol.publish() puts at the rank's position key."""
    shown = position(doc)
    beat = shown.pop("beat", None)
    own, where = text.texts(shown)
    return _with_beat(own, beat, where).encode()


SHAPES = [
    state(3),
    state(4, records=0),
    state(5, records=3),
    state(6, rank_condition={"condition": {"kind": "rank_only"}}),
    {k: v for k, v in state(7).items() if k != "beat"},
    {k: v for k, v in state(8).items() if k != "stacks"},
    {"rank": 9},
    {"rank": 10, "inflight": []},
]


@pytest.mark.parametrize("doc", SHAPES, ids=range(len(SHAPES)))
def test_a_published_position_reads_back_as_it_was_sent(doc):
    raw = published(doc)
    assert json.loads(raw)  # one JSON object, as before
    assert text.read([raw, raw], WORLD) == [position(doc)] * 2 == [text.canonical(raw, WORLD)] * 2  # the 2nd: cut


def test_ranks_waiting_in_one_call_share_where_they_stand_and_it_is_decoded_once(monkeypatch):
    raws = [published(state(rank)) for rank in range(WORLD)]
    parsed = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda data, *a, **k: parsed.append(data) or loads(data, *a, **k))
    read = text.read(raws, WORLD)
    assert read == [position(state(rank)) for rank in range(WORLD)]
    assert len(parsed) == 2  # the ranks' own parts in one call, where they stand once
    read[0]["inflight"][0]["age_s"] = 99.0  # each rank's records are its own (the rest is shared, read-only)
    assert read[1]["inflight"][0]["age_s"] == 3.01


def _variants(raw: bytes) -> list:
    """Texts near a published one, as a torn write or someone else on the store's port could leave them."""
    doc = json.loads(raw)
    own = {k: v for k, v in doc.items() if k not in text.WHERE}
    where = {k: v for k, v in doc.items() if k in text.WHERE}

    def joined(first: dict, second: dict) -> bytes:
        return (
            json.dumps(first, separators=(",", ":"))[:-1] + "," + json.dumps(second, separators=(",", ":"))[1:]
        ).encode()

    times = own.get(text.RECORDS_OWN) or []
    return [
        raw,
        raw[:-1],  # torn
        raw + b" ",
        b"{" + raw[raw.index(text.CUT) :],  # no fields of its own: "{," is no JSON
        joined(own, {**where, "rank": 1}),  # a key twice: the last one wins
        joined({**own, "inflight": []}, where),
        joined(own, {**where, text.RECORDS_OWN: times}),  # the times after the records
        joined({k: v for k, v in own.items() if k != text.RECORDS_OWN}, {**where, text.RECORDS_OWN: times}),
        joined(own, {**where, "rank": 999}),  # out of bounds, and the one that counts
        joined({**own, "pid": "x"}, {**where, "pid": 5}),  # out of its type, and not the one that counts
        joined({**own, text.RECORDS_OWN: times + times}, where),  # more times than records
        joined({**own, text.RECORDS_OWN: [{**t, "seq": 1} for t in times]}, where),  # a time that is not one
        joined({**own, text.RECORDS_OWN: [{**t, "age_s": -1.0} for t in times]}, where),  # out of bounds
        joined({**own, text.RECORDS_OWN: [{**t, "start": "x"} for t in times]}, where),
        joined({**own, text.RECORDS_OWN: [{**t, "peer": -1} for t in times]}, where),
        joined({k: v for k, v in own.items() if k != text.RECORDS_OWN}, where),  # no times: the records stand as sent
        joined({**own, "free": {"a": 1, "inflight": 2}}, where),  # the cut's text inside a field of its own
        joined({**own, "pid": "x"}, where),  # a field of its own out of its type
        joined(own, {**where, "stacks": "x"}),  # a shared field out of its type
        joined(own, {**where, "inflight": [1]}),
        joined({**own, "recent": [{"seq": 1, "group": "0", "op": "x", "state": "completed"}] * 10}, where),
        raw.replace(b'"rank":', b'"rank" :', 1),
        raw.replace(b"{", b"[", 1),
    ]


def test_any_text_reads_as_a_whole_decode_reads_it_alone_or_among_others(monkeypatch):
    monkeypatch.setattr(text.validate, "MAX_RECORDS", 12)  # the records' limit at a size a variant reaches
    rng = random.Random(7)
    raws = [published(doc) for doc in SHAPES[:4]]
    variants = [v for raw in raws for v in _variants(raw)]
    for raw in raws:  # bytes cut away, or flipped, anywhere
        for _ in range(40):
            at = rng.randrange(len(raw))
            variants.append(raw[:at] + raw[at + 1 :])
            variants.append(raw[:at] + bytes([rng.choice(b'{}[],:"0a')]) + raw[at + 1 :])
    expected = [text.canonical(raw, WORLD) for raw in variants]
    assert [text.read([raw, raw], WORLD) for raw in variants] == [[found, found] for found in expected]
    assert text.read(variants, WORLD) == expected  # together: the ranks' own parts parsed in one call
    kinds = {type(found) for found in expected}
    assert kinds == {dict, type(None), str}  # the variants reach every outcome: read, left out, unparsed
