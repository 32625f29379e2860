"""The words of what a finding rests on (its `basis`): the fact observed in the run, or the reading, and what would
confirm a reading. The analysis names them (analysis/table.py: Stage.proves, KIND_STATUS); the words are here."""

from __future__ import annotations

from .ranks_text import rank_list

FACTS = {
    "silent_rank": "a rank stopped publishing while the others wait: its process is gone, or alive and silent past "
    "dead_after",
    "waits_in_a_cycle": "every live rank is blocked, and the calls they wait in wait on one another in a cycle that no "
    "pending call can break",
    "calls_never_match": "every live rank is blocked, and in one group they wait in calls that can never match one "
    "another (different positions, collectives or sizes)",
    "waits_on_exited": "ranks exited while the others wait in a collective those ranks can no longer join",
    "wait_past_timeout": "a wait outlasted the timeout configured for ddpwatch",
}

_CAUSE = "which rank is the culprit, at which line, and why: read from the ranks' histories, stacks and source"
_LINES = "the lines named, on the ranks named: whether that call runs there and not on the others"
READINGS = {  # kind -> (what is inferred, what would confirm it)
    "ddp_forward_on_subset": (_CAUSE, _LINES),
    "collective_on_subset": (_CAUSE, _LINES),
    "skipped_collective": (_CAUSE, _LINES),
    "uneven_inputs": (_CAUSE, "each rank's number of batches this epoch (len() of its loader or sampler)"),
    "local_decision": (_CAUSE, "the value the condition named reads on each rank (print it before the exit)"),
    "caught_exception": (_CAUSE, "the exception the handler named caught (log it there)"),
    "silent_mismatch": (
        "ranks completed one position with different collectives, reduce ops, roots, dtypes or sizes: compared "
        "position by position as the ranks numbered them, from the fingerprints their peers published",
        "TORCH_DISTRIBUTED_DEBUG=DETAIL, which checks each collective's op, shapes and dtypes across ranks before "
        "it runs; or printing the values at the lines named, on each rank",
    ),
    "crossed_collectives": (
        "ranks passed the same lines in different orders, so values may have changed variables: read from the "
        "order of call sites, which correct code that pairs different lines on purpose can also produce",
        "printing, at the lines named, which tensor each rank passes at each position",
    ),
}


def worded_basis(basis, kind: str) -> dict | None:
    """A finding's basis with its words: `says` (the fact), `reading`, `confirm`; None for one in no known shape."""
    if not isinstance(basis, dict) or basis.get("status") not in ("fact", "explained", "reading"):
        return None
    reading, confirm = READINGS.get(kind, (None, None)) if basis["status"] != "fact" else (None, None)
    worded = {
        "status": basis["status"],
        "fact": basis.get("fact") if isinstance(basis.get("fact"), str) else None,
        "acts": basis.get("acts") is True,
        "says": FACTS.get(str(basis.get("fact"))),
        "reading": reading,
        "confirm": confirm,
    }
    if isinstance(basis.get("confirmed"), bool):  # analysis/confirm.py: the ranks' own answers, or the store alone
        worded["confirmed"] = basis["confirmed"]
        unconfirmed = [r for r in basis.get("unconfirmed") or () if type(r) is int]
        if not basis["confirmed"]:
            worded["unconfirmed"] = unconfirmed
    return worded


def _confirmation_line(basis: dict) -> str:
    """Whether the ranks described confirmed it in their own answers, or it rests on what the job's store held."""
    if basis.get("confirmed") is True:
        return " Confirmed by the ranks it describes, in their own answers to this incident."
    if basis.get("confirmed") is not False:
        return ""
    unconfirmed = basis.get("unconfirmed") or []
    who = rank_list(unconfirmed) if unconfirmed else "the ranks it describes"
    return (
        f" Not confirmed by {who} in their own answers to this incident: it rests on what the job's store held, "
        "which anything that reaches the store's port can write; reported, never acted on."
    )


def basis_line(basis) -> str | None:
    """One line for report.txt: what the verdict rests on, and for a reading what would confirm it."""
    if not isinstance(basis, dict):
        return None
    if basis.get("status") == "reading":
        line = "A reading, not a proof: reported, never acted on"
        if basis.get("reading"):
            line += f" ({basis['reading']})"
        line += f". To confirm: {basis['confirm']}." if basis.get("confirm") else "."
        return line + _confirmation_line(basis)
    line = f"Fact: {basis.get('says') or basis.get('fact')}."
    if basis.get("status") == "explained" and basis.get("reading"):
        line += f" Reading: {basis['reading']}; to confirm: {basis.get('confirm')}."
    return line + _confirmation_line(basis)
