"""Whether the ranks a verdict describes confirmed it in their own answers, or it rests on the store (plain data).

The job's store is unauthenticated: a position or a fingerprint read there is a claim anyone on its port can
write. An incident's answer is the rank's own word, sent for that incident. So a verdict that may end a job needs
every rank it places blocked to have answered (a rank that cannot answer, gone or frozen, is the leader's own
observation: heartbeats that stopped, a process that is gone); a reading of completed collectives is confirmed when
the ranks it compares show the same mismatch in their answers, refuted when they answer the position and agree, and
otherwise reported as resting on the store alone.
"""

from __future__ import annotations

from .reading import blocked_records, is_blocked

CONFIRMED, REFUTED, UNCONFIRMED = "confirmed", "refuted", "unconfirmed"


def unconfirmed_blocked(states: dict, silent: dict, grace: float) -> list:
    """The ranks `states` place blocked in a collective whose state is a stand-in read from the store (`stale`), not
    their answer; ranks in `silent` (gone, frozen: they cannot answer) are the leader's own observation."""
    return sorted(
        rank for rank, state in states.items() if state.get("stale") and rank not in silent and is_blocked(state, grace)
    )


def stale_and_behind(states: dict, silent: dict, grace: float) -> list:
    """The blocked ranks whose state is a stand-in read from the store (`stale`: not their answer; not `silent`) and
    whose wait sits at an earlier position of its group than another rank's wait there. A rank that moved on before
    its watchdog published again (a loaded machine starves that thread for a round) left exactly such a position
    behind, indistinguishable from a rank truly behind the others; a rank truly blocked in a collective answers (the
    GIL is free there). So a proof may not rest on one: seen once beside a CPU-bound neighbour, a peer's position
    12 collectives old made a false deadlock report with the wrong culprit."""
    waits = {
        rank: record
        for rank, record in blocked_records(states, grace).items()
        if record.get("peer") is None and type(record.get("seq")) is int
    }
    newest: dict = {}
    for record in waits.values():
        newest[record.get("group")] = max(record["seq"], newest.get(record.get("group"), record["seq"]))
    return sorted(
        rank
        for rank, record in waits.items()
        if (states[rank] or {}).get("stale") and rank not in silent and record["seq"] < newest[record.get("group")]
    )


def compared_ranks(finding: dict) -> list:
    """The ranks a completed-mismatch finding compares: every side's, every order's."""
    facts = finding.get("facts") or {}
    ranks = {r for side in facts.get("sides") or () for r in side.get("ranks") or ()}
    ranks |= {r for order in facts.get("orders") or () for r in order.get("ranks") or ()}
    return sorted(r for r in ranks if type(r) is int)


def _positions_of(finding: dict) -> tuple:
    """(group, [seq, ...]) a completed-mismatch finding names."""
    facts = finding.get("facts") or {}
    seqs = facts.get("seqs")
    listed = seqs if isinstance(seqs, list) else [facts.get("seq")]
    return facts.get("group"), [s for s in listed if type(s) is int]


def _holds(doc, group, seqs: list) -> bool:
    """Whether a fingerprint document has a signature at every one of `seqs` in `group`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), dict) or not seqs:
        return False
    entry = doc["groups"].get(group)
    if not isinstance(entry, dict) or type(entry.get("first")) is not int or not isinstance(entry.get("ids"), list):
        return False
    first, ids = entry["first"], entry["ids"]
    return all(0 <= seq - first < len(ids) and type(ids[seq - first]) is int and ids[seq - first] >= 0 for seq in seqs)


def completed(findings: list, again_fingerprint: str, fingerprint: str, answers: dict) -> tuple:
    """(CONFIRMED | REFUTED | UNCONFIRMED, the compared ranks whose answer did not hold the positions) of a
    completed-mismatch reading: `again_fingerprint` is the mismatch the answers alone show ("" for none),
    `fingerprint` the one read from the store, `answers` {rank: answered state}."""
    if again_fingerprint and again_fingerprint == fingerprint:
        return CONFIRMED, []
    missing = set()
    for finding in findings:
        group, seqs = _positions_of(finding)
        missing |= {
            rank
            for rank in compared_ranks(finding)
            if not _holds((answers.get(rank) or {}).get("fingerprints"), group, seqs)
        }
    return (UNCONFIRMED if missing else REFUTED), sorted(missing)


def with_confirmation(findings: list, unconfirmed: list) -> list:
    """The findings, each basis saying whether the ranks it rests on confirmed it (`unconfirmed`: those that did
    not, by their own answer); a finding not confirmed does not act, whatever its kind."""
    marked = []
    for finding in findings:
        basis = dict(finding.get("basis") or {}, confirmed=not unconfirmed)
        if unconfirmed:
            basis.update(unconfirmed=list(unconfirmed), acts=False)
        marked.append(dict(finding, basis=basis))
    return marked


MAX_ASKED_GROUPS = 8  # groups an incident asks the ranks' answers to hold positions of


def asked_positions(findings: list) -> dict:
    """{group: the oldest position a completed-mismatch finding names there}: each rank's answer holds its
    positions from there on (watch/fingerprints.py), so the comparison can be made on what the ranks answer."""
    asked: dict = {}
    for finding in findings:
        group, seqs = _positions_of(finding)
        if isinstance(group, str) and seqs and (group in asked or len(asked) < MAX_ASKED_GROUPS):
            asked[group] = min([*seqs, asked.get(group, seqs[0])])
    return asked


def reread(findings: list, states: dict, silent: dict, grace: float) -> list:
    """The findings of an incident analysed again from its saved states (`ddpwatch report --reanalyze`), each basis
    saying what the live writer said: a state marked `stale` stood in for a rank that did not answer."""
    blocked = unconfirmed_blocked(states, silent, grace)
    marked = []
    for finding in findings:
        compared = compared_ranks(finding)  # a completed mismatch: the ranks compared, blocked or not
        missing = [r for r in compared if (states.get(r) or {}).get("stale")] if compared else blocked
        marked.extend(with_confirmation([finding], missing))
    return marked
