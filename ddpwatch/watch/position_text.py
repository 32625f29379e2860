"""A position's text in the store: the rank's own fields first, then where it stands, decoded once per distinct text.

The leader reads every rank's position each round while some rank waits (watch/watchdog.py `watch`), and at tens of
thousands of ranks decoding and checking them was most of the time to a verdict (docs/scale.md): 30 us a rank of
JSON parsing and format checks, for documents that in a hang are the same but for a few values. So a position is
written in two parts, one JSON object as before: first every field that is the rank's own (rank, pid, host, beat,
idle time, groups ... and each in-flight record's own fields - its times and its peer - under `record_own`), then,
from `"inflight"` on, where the rank stands: its in-flight records without those fields, its stacks and its rank
condition. Ranks waiting in one call at one line write the same bytes there, so the reader decodes and checks that
part once for all of them and each rank's own part alone (its records are copied with their own fields; the rest
is shared, read-only). A text whose where no other rank shares is read whole (canonical), so ranks that all stand
apart cost what a whole read costs.

What a reader gets is what `canonical` gives for the whole text (a stand-alone JSON decode, each record given back
its own fields, then the format's checks); the cut is only a way to get there sooner, and any text it does not fit
(written by someone else, or cut where it cannot be) is read the canonical way.
"""

from __future__ import annotations

import collections

from ..format import documents, validate
from . import state_store

# What a rank waiting in a call shares with the others waiting there: written last, from "inflight" on.
WHERE = ("inflight", "stacks", "rank_condition")
OWN = validate.RECORD_OWN  # a record's fields that differ rank by rank in one call (its times, its peer)
RECORDS_OWN = "record_own"  # each in-flight record's own fields, in their order, among the rank's own fields
CUT = b',"inflight":'  # no JSON string holds an unescaped quote: this is the key, and a cut at it parses only at
# the top level (cut inside a nested object, the head's one closing brace leaves an object open)
_LEFT_OUT = object()
UNPARSED = "unparsed"  # read()'s word for a text it could not parse at all (too big, not a JSON object)


def texts(shown: dict) -> tuple:
    """(the rank's own fields as JSON without the closing brace, where it stands as JSON from ',"inflight":' to the
    closing brace, or "}" when it holds no records list): the beat goes between them (store.JobProtocol)."""
    inflight = shown.get("inflight")
    if not isinstance(inflight, list) or not all(isinstance(record, dict) for record in inflight):
        return documents.dumps(shown)[:-1], "}"
    own = {key: value for key, value in shown.items() if key not in WHERE}
    own[RECORDS_OWN] = [{key: record[key] for key in OWN if key in record} for record in inflight]
    where = {"inflight": [{key: value for key, value in r.items() if key not in OWN} for r in inflight]}
    where.update((key, shown[key]) for key in WHERE[1:] if key in shown)
    return documents.dumps(own)[:-1], "," + documents.dumps(where)[1:]


def canonical(raw: bytes, world_size: int):
    """The position a text holds: decoded whole, its records given back their own fields, checked; UNPARSED when
    it could not be parsed (too big, torn, not a JSON object), None when it is not a position (a field out of
    bounds, own fields that do not fit its records)."""
    return _whole(_decoded_all([raw])[0], world_size)


def read(raws: list, world_size: int) -> list:
    """[position, None or UNPARSED] of each raw text, as `canonical` reads it: a where that several ranks share
    decoded and checked once, and those ranks' own parts in one parser call; the other texts whole, in another."""
    cuts = [raw.find(CUT) if len(raw) <= state_store.MAX_VALUE_BYTES else -1 for raw in raws]
    where_of = [raw[cut + 1 :] if cut > 0 else None for raw, cut in zip(raws, cuts)]
    shared = {where for where, count in collections.Counter(where_of).items() if count > 1 and where is not None}
    heads = _decoded_all([raw[:cut] + b"}" if w in shared else None for raw, cut, w in zip(raws, cuts, where_of)])
    wheres: dict = {}  # where's bytes -> (its fields, they pass the checks), or None: read whole
    out: list = []
    whole = []  # the indexes of the texts read whole
    for raw, where_bytes, head in zip(raws, where_of, heads):
        if head and where_bytes is not None:  # an empty head: "{," is no JSON
            if where_bytes not in wheres:
                wheres[where_bytes] = _where(where_bytes, world_size)
            where = wheres[where_bytes]
            if where is not None and head.keys().isdisjoint(where[0]):  # a key twice: the whole read says which wins
                out.append(_joined(head, where, world_size))
                continue
        whole.append(len(out))
        out.append(raw)
    for index, doc in zip(whole, _decoded_all([out[index] for index in whole])):
        out[index] = _whole(doc, world_size)
    return out


def _whole(doc: dict | None, world_size: int):
    """canonical()'s reading of a text decoded whole (None: it did not parse)."""
    if doc is None:
        return UNPARSED
    doc = _given_own(doc, doc.pop(RECORDS_OWN, _LEFT_OUT), world_size, shared=False)
    return doc if doc is not None and validate.published_state(doc, world_size) else None


def _decoded_all(texts: list) -> list:
    """Each text decoded as the store decodes its values (state_store.decode_each: one parser call for thousands),
    a None given as None."""
    found = iter(state_store.decode_each([text for text in texts if text is not None]))
    return [None if text is None else next(found) for text in texts]


def _where(where_bytes: bytes, world_size: int) -> tuple | None:
    fields = _decoded_all([b"{" + where_bytes])[0]
    if fields is None or RECORDS_OWN in fields:  # the records' own fields after them: canonical() says which count
        return None
    # its fields alone checked as a rank's state would be (any rank: the checks of a field never read another)
    return fields, validate.published_state({**fields, "rank": 0}, world_size)


def _joined(head: dict, where: tuple, world_size: int) -> dict | None:
    """canonical()'s reading of the text that was cut into `head` and `where`, with where's checks done once."""
    fields, where_passes = where
    own = head.pop(RECORDS_OWN, _LEFT_OUT)
    if not where_passes or not validate.published_state(head, world_size):
        return None
    head.update(fields)
    doc = _given_own(head, own, world_size)
    return doc if doc is not None and validate.within_record_limit(doc) else None


def _given_own(doc: dict, own, world_size: int, shared: bool = True) -> dict | None:
    """`doc` with each in-flight record given its own fields (a copy of the record where other ranks' documents
    share it); None where they do not fit (not one checked entry a record)."""
    if own is _LEFT_OUT:
        return doc
    inflight = doc.get("inflight")
    if (
        not isinstance(inflight, list)
        or not isinstance(own, list)
        or len(own) != len(inflight)
        or not all(isinstance(record, dict) for record in inflight)
        or not validate.records_own(own, world_size)
    ):
        return None
    if shared:
        doc["inflight"] = [{**record, **fields} for record, fields in zip(inflight, own)]
    else:
        for record, fields in zip(inflight, own):
            record.update(fields)
    return doc
