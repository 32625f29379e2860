"""The one table of finding kinds: every pass, the stage it runs in, and every kind it may emit."""

from __future__ import annotations

from typing import Callable, NamedTuple

from .passes import (
    collective_on_subset_or_mismatch,
    collective_stuck,
    ddp_forward_on_subset,
    group_order,
    sequence_divergence,
    shape_mismatch,
    silent_ranks,
    skipped_by_exited,
    straggler,
)
from .departure import departed, departed_ahead, departed_and_exited
from .p2p import p2p_deadlock
from .silent import crossed_collectives, mismatch_crash, silent_mismatch

DEADLOCK = "deadlock"
TIMEOUT = "timeout"
DUMP = "dump"
SILENT = "silent_rank"
MISMATCH = "mismatch"  # collectives completed without matching: nothing hangs, the numbers are wrong


class Stage(NamedTuple):
    """A situation assess() looks for; every pass of one stage takes the same arguments (`takes`)."""

    name: str
    takes: str  # the arguments each pass of the stage is called with, in this order
    verdict: str  # the incident's trigger when a pass of this stage finds something
    fingerprint_suffix: str = ""  # the same waits seen by another stage are another cause: reported again
    # The fact this stage's findings rest on, observed in the run (its name: render/basis_words.py words it); None:
    # they rest on readings alone (inferred from order, history or source text): reported, never acted on.
    proves: str | None = None


# The stages in the order assess() tries them (the conditions between them are assess()'s own).
STAGE_SILENT = Stage(  # heartbeats stopped while others wait
    "silent",
    "silent, live, grace",
    SILENT,
    "-silent",
    "silent_rank",
)
STAGE_CROSSING = Stage(  # every live rank blocked, any group
    "crossing",
    "waiting, live, world_size",
    DEADLOCK,
    proves="waits_in_a_cycle",
)
STAGE_MISMATCH = Stage(  # one group's calls can never match (classify)
    "mismatch",
    "parts, states",
    DEADLOCK,
    proves="calls_never_match",
)
STAGE_EXITED = Stage(  # ranks gone, others wait
    "exited",
    "live, exited, grace, world_size",
    DEADLOCK,
    "-exited",
    "waits_on_exited",
)
STAGE_TIMEOUT = Stage(  # a wait outlasted the timeout
    "timeout", "live, blocked, timeout", TIMEOUT, proves="wait_past_timeout"
)
# positions every rank completed, compared by fingerprint (analysis/silent.py): no rank needs to be blocked. Nothing
# hangs, and the comparison rests on the ranks' numbering of positions lining up and on peers' published
# fingerprints (the store is unauthenticated): a reading, reported and never acted on.
STAGE_COMPLETED = Stage("completed", "fingerprints, world_size", MISMATCH, "-completed")
STAGES = (STAGE_SILENT, STAGE_CROSSING, STAGE_MISMATCH, STAGE_EXITED, STAGE_TIMEOUT, STAGE_COMPLETED)


class FindingPass(NamedTuple):
    """One row of FINDING_PASSES: a pass, the stage it runs in, and every finding kind it may emit."""

    run: Callable  # (the stage's arguments) -> a Finding, a list of them, or None
    stage: Stage
    kinds: tuple


# The kinds whose ranks can no longer read or write the store (gone, or stopped): nothing waits for their word.
CANNOT_ANSWER = ("dead_rank", "unresponsive_rank")

# The one list of finding kinds (FINDING_KINDS is read from it; a pass emitting a kind its row does not name is an
# error). Within a stage the first row, in this order, that finds something wins.
# A pass that builds on others (sequence_divergence, skipped_by_exited) lists every kind it may hand on; so does
# collective_on_subset_or_mismatch, whose culprit rules end in one of four kinds (the rule decides which).
FINDING_PASSES = (
    # a peer the backend aborted inside a collective a survivor's call failed in: both lines (silent.py)
    FindingPass(mismatch_crash, STAGE_SILENT, ("mismatch_crash",)),
    FindingPass(silent_ranks, STAGE_SILENT, CANNOT_ANSWER),
    # first: a cycle through a send or recv is named as such, before group_order reads the same waits by group
    FindingPass(p2p_deadlock, STAGE_CROSSING, ("p2p_deadlock",)),
    FindingPass(group_order, STAGE_CROSSING, ("group_order",)),
    # a rank that departed and went on through a collective the others never joined: departed() where they diverged
    FindingPass(departed_ahead, STAGE_MISMATCH, ("local_decision", "caught_exception")),
    # then: ranks at different positions are compared where they diverged, with the passes below
    FindingPass(
        sequence_divergence,
        STAGE_MISMATCH,
        (
            "shape_mismatch",
            "ddp_forward_on_subset",
            "collective_on_subset",
            "skipped_collective",
            "uneven_inputs",
            "collective_mismatch",
        ),
    ),
    FindingPass(shape_mismatch, STAGE_MISMATCH, ("shape_mismatch",)),
    FindingPass(ddp_forward_on_subset, STAGE_MISMATCH, ("ddp_forward_on_subset",)),
    # a rank left the common path by a decision on a value of its own, or an exception it caught (its own history
    # and the source read into its state say where); before the culprit rules, which would call it uneven data
    FindingPass(departed, STAGE_MISMATCH, ("local_decision", "caught_exception")),
    # last: it always finds something (collective_mismatch when no rule names a culprit)
    FindingPass(
        collective_on_subset_or_mismatch,
        STAGE_MISMATCH,
        ("collective_on_subset", "skipped_collective", "uneven_inputs", "collective_mismatch"),
    ),
    # an exited rank that left the loop by a decision of its own (or an exception it caught), read as departed() does
    FindingPass(departed_and_exited, STAGE_EXITED, ("local_decision", "caught_exception")),
    FindingPass(skipped_by_exited, STAGE_EXITED, ("collective_on_subset", "skipped_collective")),
    FindingPass(collective_stuck, STAGE_TIMEOUT, ("collective_stuck",)),
    FindingPass(straggler, STAGE_TIMEOUT, ("straggler",)),
    # a wrong dtype, count, reduce op or collective is named before a crossing (which needs all of those equal)
    FindingPass(silent_mismatch, STAGE_COMPLETED, ("silent_mismatch",)),
    FindingPass(crossed_collectives, STAGE_COMPLETED, ("crossed_collectives",)),
)


# What each kind's own claim is, as data. FACT: the finding is the fact itself (a rank dead, a wait past the
# timeout, waits that can never match). EXPLAINED: the stage's fact (a deadlock) is proven; the kind is a reading of
# its cause (which rank, which line, why), read from histories, stacks and source. READING: nothing is proven.
FACT, EXPLAINED, READING = "fact", "explained", "reading"


# Only a stage that proves something acts (AbortPolicy.action_for); a READING kind never does, nor a kind missing
# here (a new kind is a reading until it is given a status).
KIND_STATUS = {
    "mismatch_crash": FACT,
    "dead_rank": FACT,
    "unresponsive_rank": FACT,
    "p2p_deadlock": FACT,
    "group_order": FACT,
    "shape_mismatch": FACT,
    "collective_mismatch": FACT,
    "collective_stuck": FACT,
    "straggler": FACT,
    "ddp_forward_on_subset": EXPLAINED,
    "collective_on_subset": EXPLAINED,
    "skipped_collective": EXPLAINED,
    "uneven_inputs": EXPLAINED,
    "local_decision": EXPLAINED,
    "caught_exception": EXPLAINED,
    "silent_mismatch": READING,
    "crossed_collectives": READING,
}


def basis(stage: Stage, kind: str) -> dict:
    """What a finding of `kind` found at `stage` rests on, for report.json: its status, the fact's name (None: a
    reading alone) and whether a rank-ending action may act on it. render/basis_words.py adds the words."""
    status = KIND_STATUS.get(kind, READING) if stage.proves else READING
    return {"status": status, "fact": stage.proves if status != READING else None, "acts": status != READING}


def acts_on(trigger: str | None) -> bool:
    """Whether an incident of this trigger rests on a fact some stage proves (a rank-ending action may act on it)."""
    return any(stage.proves for stage in STAGES if stage.verdict == trigger)


def findings_act(findings) -> bool:
    """Whether any finding of an incident rests on a fact (its basis says so; a finding without one does not)."""
    return any(isinstance(f, dict) and (f.get("basis") or {}).get("acts") is True for f in findings or ())


def kinds_of(passes) -> tuple:
    """Every kind the table's rows may emit, each once, in table order."""
    return tuple(dict.fromkeys(kind for row in passes for kind in row.kinds))


FINDING_KINDS = kinds_of(FINDING_PASSES)


def declared(row: FindingPass, found: dict) -> dict:
    """A pass may emit only the kinds its row declares (a kind cannot exist outside the table), as facts.

    Words are render's (render/wording.py): a finding carrying its own summary would bypass them.
    """
    if found["kind"] not in row.kinds:
        raise ValueError(
            f"{row.run.__name__} emitted finding kind {found['kind']!r}, not one of its row's kinds {row.kinds}"
        )
    if "facts" not in found or "summary" in found:
        raise ValueError(
            f"{row.run.__name__} emitted a finding without facts or with words of its own: "
            "build it with analysis.passes.finding()"
        )
    return dict(found, basis=basis(row.stage, found["kind"]))
