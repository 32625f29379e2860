"""The words of the two departure kinds, local_decision and caught_exception, from their facts (render/wording.py
holds them in SENTENCES)."""

# wording.py imports this module and hands it the phrases every kind shares (Phrases): none is imported from there.

from __future__ import annotations

from typing import Callable, NamedTuple

from ..format import build


class Phrases(NamedTuple):
    """What render/wording.py says the same way for every kind."""

    describe: Callable  # a record -> 'broadcast of module buffers inside DistributedDataParallel.forward at ...'
    sentence: Callable  # text -> the same text starting with a capital
    verb: Callable  # (ranks, one, many) -> the form for one rank or many


def _exit_site(facts: dict) -> str:
    return build.short_site(dict(facts["location"], line=facts["exit"]["line"]))


def _at(facts: dict, line) -> str:
    return build.short_site(dict(facts["location"], line=line))


def _what_it_did(facts: dict) -> str:
    """'left the loop `for epoch in range(20):`', what taking the exit did."""
    kind, loop = facts["exit"]["kind"], (facts.get("loop") or {}).get("text")
    proof = facts.get("proof") or {}
    if kind == "break":
        return f"left the loop `{loop}`"
    if kind == "return" and proof.get("rule") == "passed_by":
        return (
            f"returned from {facts['location'].get('function')}() before the collective at "
            f"{_at(facts, proof.get('call'))}"
        )
    if kind == "return":
        return f"returned from {facts['location'].get('function')}() out of the loop `{loop}`"
    return f"skipped the rest of that iteration of `{loop}`"


def _now(facts: dict, ranks_text, ph) -> str:
    """What the culprits do now: the call they wait in, or that they exited."""
    culprits = facts["culprits"]
    if facts.get("record") is None:
        return f"{ranks_text(culprits)} exited"
    return f"{ranks_text(culprits)} {ph.verb(culprits, 'is', 'are')} now in {ph.describe(facts['record'])}"


def _loops_text(proof: dict) -> str:
    return ", ".join(f"`{text}`" for text in proof.get("loops") or ())


EPOCHS = " (Observed in the run: each rank's DataLoader epochs.)"
BASIS = {  # what each proof against data running out rests on, said after it
    "began_more": EPOCHS,
    "short_last_epoch": EPOCHS,
    "equal_lengths": EPOCHS,
    "not_ended": " (Observed in the run: the iterator its own frame held when the incident was taken.)",
    "counted": " (Read from the source.)",
    "endless": " (Read from the source.)",
}


def _not_data_running_out(facts: dict, ranks_text, ph) -> str:
    """Why the loop was not left by an iterator that ended, and what that rests on: observed in the run (the
    DataLoader epochs ddpwatch counted) or read from the source."""
    text = _why_not_data(facts, ranks_text, ph)
    rule = (facts.get("proof") or {}).get("rule")
    if not text or facts.get("proof", {}).get("skipped"):
        return text
    return text + BASIS.get(str(rule), "")


def _why_not_data(facts: dict, ranks_text, ph) -> str:
    """Why the loop was not left by an iterator that ended (the facts' proof), as a sentence."""
    proof, culprits, others = facts.get("proof") or {}, facts["culprits"], facts["others"]
    rule = proof.get("rule")
    if rule == "passed_by":
        swapped = dict(facts, culprits=others, others=culprits, proof=dict(proof, rule=proof.get("by"), skipped=False))
        why = _not_data_running_out(swapped, ranks_text, ph)  # the proof was read for the ranks that stand in the call
        return (
            f" {ph.sentence(ranks_text(others))} {ph.verb(others, 'stands', 'stand')} in the call made at "
            f"{_at(facts, proof.get('at'))}, which {ranks_text(culprits)} went past on "
            f"{ph.verb(culprits, 'its', 'their')}"
            " way round the loop:" + why[len(" Not data running out:") :]
            if why
            else ""
        )
    if proof.get("skipped"):
        return (
            f" Not data running out: {_same_iterations(proof, facts, ranks_text)}; {ranks_text(culprits)} ran "
            f"them all with fewer collectives than {ranks_text(others)}, so {ph.verb(culprits, 'it', 'they')} "
            f"skipped those of an iteration, and this `{facts['exit']['kind']}` is the one way the loops offer."
        )
    if rule in ("counted", "equal_lengths"):
        return f" Not data running out: {_same_iterations(proof, facts, ranks_text)}."
    if rule == "began_more":
        return (
            f" Not data running out: every rank ran {' or '.join(map(str, proof['steps']))} training steps per "
            f"epoch until then; {ranks_text(others)} began epoch {proof['epochs'] + 1}, "
            f"{ranks_text(culprits)} did not."
        )
    if rule == "short_last_epoch":
        return (
            f" Not data running out: {ranks_text(culprits)} ran {proof['last_steps']} training steps in epoch "
            f"{proof['epochs']}, where {ph.verb(culprits, 'its', 'their')} earlier epochs, like the other ranks', "
            f"ran {' or '.join(map(str, proof['steps']))}."
        )
    if rule == "not_ended":
        return (
            f" Not data running out: when {ph.verb(culprits, 'it', 'they')} stopped, {ranks_text(culprits)} still "
            f"held `{proof.get('name')}` ({proof.get('iterator')}) with items left."
        )
    if rule == "endless":
        return f" Not data running out: `{(facts.get('loop') or {}).get('text')}` ends only by an exit."
    if rule == "within":
        return (
            f" Not data running out: {ph.verb(culprits, 'it', 'they')} left mid-iteration, after "
            f"{ph.describe(facts['last'])}, where no data loader ends; in every earlier iteration "
            f"{ph.verb(culprits, 'it', 'they')} went on from there to the call the others wait in."
        )
    return ""


def _same_iterations(proof: dict, facts: dict, ranks_text) -> str:
    """'`for step in range(4):` runs as many iterations on every rank', from a counted or equal-lengths proof."""
    if proof.get("rule") == "counted":
        loops = _loops_text(proof)
        return f"{loops} {'runs' if len(proof.get('loops') or ()) == 1 else 'run'} as many iterations on every rank"
    return (
        f"every rank's DataLoader has {proof.get('length')} batches per epoch and every rank is in epoch "
        f"{proof.get('epochs')}"
    )


def _decision_text(facts: dict) -> str:
    """'took the `continue` at train.py:59 under `if loss is None:` (train.py:58), a decision on a value each rank
    computes for itself, and skipped ...', or, when a helper decided, 'returned (`return None`) at train.py:35 from
    training_step() under `if torch.isnan(loss):` (train.py:34), a decision ...; on that result the caller took the
    `continue` at train.py:59 (`if loss is None:`) and skipped ...'."""
    condition = facts["condition"] or {}
    branch = " (its else branch)" if condition.get("branch") == "else" else ""
    where = f"`{condition.get('text')}` ({_at(facts, condition.get('line'))}){branch}"
    own = "a decision on a value each rank computes for itself"
    helper = facts.get("helper")
    if not helper:
        return (
            f"took the `{facts['exit']['kind']}` at {_exit_site(facts)} under {where}, {own}, and {_what_it_did(facts)}"
        )
    caller = helper.get("caller_condition") or {}
    return (
        f"returned (`{helper.get('text')}`) at {build.short_site(facts['location'])} from "
        f"{helper.get('function')}() under {where}, {own}; on that result the caller took the "
        f"`{facts['exit']['kind']}` at "
        f"{_exit_site(facts)} (`{caller.get('text')}`) and {_what_it_did(facts)}"
    )


def local_decision_words(facts: dict, ranks_text, ph: Phrases) -> tuple:
    """The summary and fix of a local_decision finding."""
    culprits, others, condition = facts["culprits"], facts["others"], facts["condition"] or {}
    summary = (
        f"{ph.sentence(ranks_text(culprits))} {_decision_text(facts)}, while "
        f"{ranks_text(others)} went on: {ranks_text(others)} {ph.verb(others, 'waits', 'wait')} in "
        f"{ph.describe(facts['waited'])}, which {ranks_text(culprits)} will never join, and "
        f"{_now(facts, ranks_text, ph)}." + _not_data_running_out(facts, ranks_text, ph)
    )
    helper = facts.get("helper")
    take = (
        f"return at {build.short_site(facts['location'])} (and so the caller's `{facts['exit']['kind']}` at "
        f"{_exit_site(facts)})"
        if helper
        else f"take the `{facts['exit']['kind']}` at {_exit_site(facts)}"
    )
    fix = (
        f"Make the decision collective, so that every rank takes the same branch: compute the flag behind "
        f"`{condition.get('text')}` on every rank and all_reduce it (`flag = torch.tensor(float(stop)); "
        "dist.all_reduce(flag, op=dist.ReduceOp.MAX)`, then test `flag.item() > 0`), or broadcast one rank's "
        f"decision (`dist.broadcast(flag, src=0)`), and {take} on that shared flag."
    )
    return summary, fix


def caught_exception_words(facts: dict, ranks_text, ph: Phrases) -> tuple:
    """The summary and fix of a caught_exception finding."""
    culprits, others, handler = facts["culprits"], facts["others"], facts["handler"]
    proof = facts.get("proof") or {}
    where = build.short_site(facts["location"])
    if proof.get("rule") == "in_handler":
        return _handler_talks(facts, ranks_text, ph)
    then = {"falls": "carried on after the try", "pass": "`pass`"}.get(
        facts["exit"]["kind"], f"`{facts['exit']['kind']}`"
    )
    if proof.get("skipped"):
        what = (
            f"in an earlier iteration, and so skipped that iteration's collectives; {ranks_text(others)} "
            f"{ph.verb(others, 'waits', 'wait')} in {ph.describe(facts['waited'])}, which {ranks_text(culprits)} "
            f"will never join, and {_now(facts, ranks_text, ph)}."
        )
    else:
        now = _now(facts, ranks_text, ph).replace(" is now in ", " went on to ").replace(" are now in ", " went on to ")
        what = (
            f"after {ph.describe(facts['last'])}, and so skipped {ph.describe(facts['waited'])}, where "
            f"{ranks_text(others)} {ph.verb(others, 'waits', 'wait')}; {now}."
        )
    summary = (
        f"{ph.sentence(ranks_text(culprits))} caught an exception at {where} (`{handler['text']}`, then "
        f"{then}) "
        + what
        + (
            " In every earlier iteration it went from that call to the one the others wait in."
            if proof.get("rule") == "within"
            else _not_data_running_out(facts, ranks_text, ph)
        )
    )
    fix = (
        "Skip together, or do not skip. Together: all_reduce a flag that says whether any rank's step failed "
        "(`failed = torch.tensor(float(error)); dist.all_reduce(failed)`) and skip on every rank when it is set. "
        "Or, on the rank that failed, keep its collectives: zero the loss instead of skipping (`loss = "
        f"out.sum() * 0`), so that backward() still joins the gradient all-reduce (the handler at {where})."
    )
    return summary, fix


def _handler_talks(facts: dict, ranks_text, ph) -> tuple:
    """Ranks inside an except handler that calls a collective, while the others are still in the try's body."""
    culprits, others, handler, proof = facts["culprits"], facts["others"], facts["handler"], facts["proof"]
    where = build.short_site(facts["location"])
    summary = (
        f"{ph.sentence(ranks_text(culprits))} caught an exception at {where} (`{handler['text']}`): it was "
        f"raised on {ranks_text(culprits)} only, in the try at {_at(facts, proof.get('try'))}, and the "
        f"handler now calls {ph.describe(facts['record'])}, which {ranks_text(others)}, still in the try's "
        f"body ({ph.describe(facts['waited'])}), will never join."
    )
    fix = (
        "Rank-local error handling must not talk to the other ranks alone. Make the failure known to every rank: "
        "all_reduce a flag that says whether any rank's step failed (`failed = torch.tensor(float(error)); "
        "dist.all_reduce(failed)`) at a point every rank reaches, then run the handler's collectives on every "
        f"rank together (or skip together); or keep the handler at {where} free of collectives (save this "
        "rank's state under its own name, then re-raise)."
    )
    return summary, fix
