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


# The stages in the order assess() tries them (the conditions between them are assess()'s own).
STAGE_SILENT = Stage("silent", "silent, live, grace", SILENT, "-silent")  # heartbeats stopped while others wait
STAGE_CROSSING = Stage("crossing", "waiting, live, world_size", DEADLOCK)  # every live rank blocked, any group
STAGE_MISMATCH = Stage("mismatch", "parts, states", DEADLOCK)  # one group's calls can never match (classify)
STAGE_EXITED = Stage("exited", "live, exited, grace, world_size", DEADLOCK, "-exited")  # ranks gone, others wait
STAGE_TIMEOUT = Stage("timeout", "live, blocked, timeout", TIMEOUT)  # a wait outlasted the timeout
# positions every rank completed, compared by fingerprint (analysis/silent.py): no rank needs to be blocked
STAGE_COMPLETED = Stage("completed", "fingerprints, world_size", MISMATCH, "-completed")
STAGES = (STAGE_SILENT, STAGE_CROSSING, STAGE_MISMATCH, STAGE_EXITED, STAGE_TIMEOUT, STAGE_COMPLETED)


class FindingPass(NamedTuple):
    """One row of FINDING_PASSES: a pass, the stage it runs in, and every finding kind it may emit."""

    run: Callable  # (the stage's arguments) -> a Finding, a list of them, or None
    stage: Stage
    kinds: tuple


# The one list of finding kinds (FINDING_KINDS is read from it; a pass emitting a kind its row does not name is an
# error). Within a stage the first row, in this order, that finds something wins.
# A pass that builds on others (sequence_divergence, skipped_by_exited) lists every kind it may hand on; so does
# collective_on_subset_or_mismatch, whose culprit rules end in one of four kinds (the rule decides which).
FINDING_PASSES = (
    # a peer the backend aborted inside a collective a survivor's call failed in: both lines (silent.py)
    FindingPass(mismatch_crash, STAGE_SILENT, ("mismatch_crash",)),
    FindingPass(silent_ranks, STAGE_SILENT, ("dead_rank", "unresponsive_rank")),
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
    return found
