"""Turns rank snapshots into findings: small pure passes over plain data (no torch), run in the order of one table."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING

from ..format import build

# What other stages and the tests read from the package, besides assess(): the reading helpers the watchdog uses,
# and the passes the finding-table tests reorder.
from .passes import collective_on_subset_or_mismatch, ddp_forward_on_subset, shape_mismatch  # noqa: F401
from .reading import forget_groups, matched_elsewhere, waits_in
from .reading import is_blocked, partitions, shape_key, user_line_now, waited_s, waiting_map, waiting_record  # noqa: F401
from .table import (
    CANNOT_ANSWER,  # noqa: F401
    DEADLOCK,
    DUMP,
    FINDING_KINDS,
    FINDING_PASSES,
    MISMATCH,
    SILENT,  # noqa: F401
    STAGE_COMPLETED,
    STAGE_CROSSING,
    STAGE_EXITED,
    STAGE_MISMATCH,
    STAGE_SILENT,
    STAGE_TIMEOUT,
    STAGES,
    TIMEOUT,
    KIND_STATUS,  # noqa: F401
    FindingPass,
    Stage,
    acts_on,  # noqa: F401
    declared,
    findings_act,  # noqa: F401
    kinds_of,
)

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import RankState


@dataclasses.dataclass
class Assessment:
    """What the watchdog should do now: report a proven deadlock, report after the timeout, or nothing.

    `findings`: passes.finding()'s data (kind, ranks, location, evidence, facts), not yet worded: types.Finding is
    the form report.json holds, once render/wording.py has added the summary and fix.
    """

    verdict: str | None
    findings: list[dict]
    fingerprint: str = ""


def stage_findings(stage: Stage, *arguments) -> list[dict]:
    """The findings of the first pass of `stage` (in table order) that finds anything; [] when none does.

    FINDING_PASSES is read here, at each call: a table patched into `ddpwatch.analysis` reaches every caller.
    """
    for row in FINDING_PASSES:
        if row.stage != stage:
            continue
        found = row.run(*arguments)
        found = [found] if isinstance(found, dict) else list(found or ())
        if found:
            return [declared(row, finding) for finding in found]
    return []


def proven_mismatches(states: dict, world_size: int) -> list:
    """[(group, parts)] for each group whose waiting ranks sit in calls that can never match one another."""
    waiting = {r: rec for r, rec in waiting_map(states).items() if not rec.get("p2p")}
    by_group: dict = {}
    for rank, record in waiting.items():
        by_group.setdefault(record["group"], {})[rank] = record
    found = []
    for group, members_waiting in sorted(by_group.items()):
        if _late_not_stuck(members_waiting.values()):
            continue
        parts = partitions(members_waiting)
        if len({(rec["seq"], rec.get("api"), rec["op"], shape_key(rec)) for _, rec in parts}) > 1:
            found.append((group, parts))
    return found


def _late_not_stuck(records) -> bool:
    """Whether ranks of one group stand at different positions while one behind holds there only an op whose call
    returned and that no thread waits on (async_op=True, a functional collective): that rank is not waiting there,
    it may be on its way (a first DTensor call importing for seconds), so "they can never meet" is not proven. Same
    position, different calls stays a proof: both were issued, and can never match."""
    records = list(records)
    ahead = max(rec["seq"] for rec in records)
    return any(rec["seq"] < ahead and not waits_in(rec) for rec in records)


def classify(parts: list, states: dict) -> list[dict]:
    """The findings for one group whose waiting ranks can never match (its partitions, from proven_mismatches)."""
    return stage_findings(STAGE_MISMATCH, parts, states)


def fingerprint(states: dict) -> str:
    items = sorted((rank, rec["group"], rec["seq"], rec.get("api")) for rank, rec in waiting_map(states).items())
    return hashlib.sha1(repr(items).encode()).hexdigest()[:16]


def _verdict(stage: Stage, findings: list, live: dict) -> Assessment:
    return Assessment(stage.verdict, findings, fingerprint(live) + stage.fingerprint_suffix)


def assess(
    states: dict[int, RankState],
    world_size: int,
    grace: float,
    timeout: float,
    silent: dict | None = None,
) -> Assessment:
    """Decide from every rank's snapshot whether a hang is proven now, or a wait has outlasted the timeout.

    `silent`: {rank: {"silent_s", "process", "last_state", ...}} for ranks whose heartbeat stopped for longer than
    the watchdog's dead_after (or that never published); the watchdog measures that on its own clock.
    """
    try:
        return _assess(states, world_size, grace, timeout, silent)
    finally:
        forget_groups()  # the index of this look's groups holds its states: not past the look


def _assess(states: dict, world_size: int, grace: float, timeout: float, silent: dict | None) -> Assessment:
    silent = silent or {}
    live = {r: s for r, s in states.items() if s.get("status") != build.EXITED and r not in silent}
    # A rank ended by a signal (its own handler checkpointed and left) skipped nothing: someone ended it.
    exited = {
        r: s for r, s in states.items() if s.get("status") == build.EXITED and not s.get("signal")
    }  # rank -> its last state
    blocked = {r for r, s in live.items() if is_blocked(s, grace)}
    blocked -= matched_elsewhere({r: waiting_record(live[r]) for r in blocked}, states)
    if silent:  # nothing else is judged while a rank is silent: its last state may be stale
        # a peer the backend aborted left its stack (crashes.py): evidence enough without anyone blocked
        faulted = any(view.get("fault") for view in silent.values())
        found = stage_findings(STAGE_SILENT, silent, live, grace) if blocked or faulted else []
        return _verdict(STAGE_SILENT, found, live) if found else Assessment(None, [])
    if len(states) < world_size:
        return Assessment(None, [])  # a rank we cannot see may be the one that will unblock the rest
    if live and blocked == set(live):
        waiting = {r: waiting_record(live[r]) for r in blocked}
        found = stage_findings(STAGE_CROSSING, waiting, live, world_size)
        if found:
            return _verdict(STAGE_CROSSING, found, live)
        found = [f for _, parts in proven_mismatches(live, world_size) for f in classify(parts, live)]
        if found:
            return _verdict(STAGE_MISMATCH, found, live)
    if exited and blocked:
        found = stage_findings(STAGE_EXITED, live, exited, grace, world_size)
        if found:
            return _verdict(STAGE_EXITED, found, live)
    if blocked:
        longest = max(waited_s(live[r]) for r in blocked)
        if longest >= timeout:
            found = stage_findings(STAGE_TIMEOUT, live, blocked, timeout)
            if found:
                return _verdict(STAGE_TIMEOUT, found, live)
    return completed_mismatches(states, world_size)


def completed_mismatches(states: dict, world_size: int) -> Assessment:
    """Positions the ranks completed without matching, from the fingerprints their states carry (an incident's
    answers do; a heartbeat's position does not, so the watchdog's looks for hangs never run this)."""
    docs = {rank: state["fingerprints"] for rank, state in states.items() if state.get("fingerprints")}
    if len(docs) < 2:
        return Assessment(None, [])
    found = stage_findings(STAGE_COMPLETED, docs, world_size)
    return Assessment(MISMATCH, found, mismatch_fingerprint(found)) if found else Assessment(None, [])


def mismatch_fingerprint(findings: list) -> str:
    """One incident per mismatch: its kind, group, what differs and the lines involved. Not its position: a mismatch
    in a training loop recurs every step, and a report per step (one a watchdog round) would bury the first."""
    first = findings[0]
    facts = first["facts"]
    sites = sorted({_site_text(side.get("site")) for side in facts.get("sides") or ()})
    sites += sorted({_site_text(site) for order in facts.get("orders") or () for site in order.get("sites") or ()})
    what = "|".join([*map(str, facts.get("differs") or ()), *sites])
    digest = hashlib.sha1(what.encode("utf-8", "replace")).hexdigest()[:12]
    return f"mismatch-{first['kind']}-{facts.get('group')}-{digest}"


def _site_text(site) -> str:
    return f"{site.get('file')}:{site.get('line')}" if isinstance(site, dict) else str(site)
