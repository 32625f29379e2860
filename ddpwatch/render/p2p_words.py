"""The English of point-to-point ops: a send or recv as a report says it, and the sentences of a p2p_deadlock."""

from __future__ import annotations

from typing import Any, Mapping

from ..format import build
from .departures import Phrases

# render/wording.py imports this module: describe_op() says a send or recv with p2p_text(), and SENTENCES words
# p2p_deadlock with p2p_deadlock_words(), handing it the phrases every kind shares (Phrases).


def _p2p_half(op: str | None, peer, tag) -> str:
    if op == "recv":
        text = "recv from any rank" if peer == -1 else f"recv from rank {peer}"
    else:
        text = f"{op} to rank {peer}"
    return text + (f" (tag {tag})" if tag not in (None, 0) else "")


def p2p_text(record: Mapping[str, Any]) -> str:
    """'send to rank 1 (tag 3)', 'irecv from rank 0', 'batch_isend_irecv (send to rank 1, recv from rank 1)'."""
    ops = record.get("ops")
    if ops:
        shown = ", ".join(_p2p_half(o.get("op"), o.get("peer"), o.get("tag")) for o in ops[:4])
        more = f", {len(ops) - 4} more" if len(ops) > 4 else ""
        return f"batch_isend_irecv ({shown}{more})"
    text = _p2p_half(record.get("op"), record.get("peer"), record.get("tag"))
    api = record.get("api")
    if api in ("isend", "irecv"):
        text = api + text[4:]  # "isend to rank 1", "irecv from rank 0"
        if record.get("waited"):
            text += ", waited on"
    return text


def _counts(step: dict) -> str:
    """'; rank 1 has received 3 from it': the peer's count of this exchange, when both published theirs."""
    if step.get("count") is None or step.get("peer_count") is None:
        return ""
    verb = "received" if step["kind"] == "send" else "sent"
    preposition = "from" if step["kind"] == "send" else "to"
    return f"; rank {step['peer']} has {verb} {step['peer_count']} {preposition} it"


def _cycle_step(step: dict) -> str:
    if step["kind"] == "collective":
        what = f"{step['op']} on group {step['group']} (seq {step['seq']}) at {build.short_site(step['site'])}"
    else:
        half = _p2p_half(step["kind"], step["peer"], step["tag"])
        if step.get("count") is not None:
            half = half.replace(step["kind"], f"{step['kind']} #{step['count']}", 1)
        what = ("batch_isend_irecv: " if step.get("batch") else "") + half
        if step.get("api") in ("isend", "irecv", "batch_isend_irecv") and step.get("wait_site"):
            what += f", issued at {build.short_site(step['site'])}, waited on at {build.short_site(step['wait_site'])}"
        else:
            what += f" at {build.short_site(step['site'])}"
        what += _counts(step)
    return f"rank {step['rank']} ({what}) waits for rank {step['waits_for']}"


_BATCHES_PAIR = (
    " Between two ranks the `batch_isend_irecv` lists must pair: every isend in one rank's list needs "
    "an irecv in its peer's list (same tag), and the other way round."
)

_P2P_FIXES = {
    "send_first": (
        "Every rank of the cycle sends first and nobody receives (gloo's and NCCL's send wait for the "
        "matching recv). Post the receive before the send: `req = dist.irecv(buf, src=peer)`, then "
        "`dist.send(...)`, then `req.wait()`; or exchange both in one "
        "`dist.batch_isend_irecv([P2POp(dist.isend, ...), P2POp(dist.irecv, ...)])`; or order by rank "
        "parity (even ranks send then receive, odd ranks receive then send)."
    ),
    "recv_first": (
        "Every rank of the cycle waits to receive before it sends. If both sides were meant to send here, "
        "let one side send first: order by rank parity (even ranks send then receive, odd ranks receive "
        "then send), or post both halves at once with `dist.batch_isend_irecv([P2POp(dist.isend, ...), "
        "P2POp(dist.irecv, ...)])`. If one side has sent all it meant to (the counts above differ), the "
        "two sides disagree on how many messages a step has (microbatches, chunks, iterations): compute "
        "that count the same way on every rank."
    ),
    "crossed": (
        "The ranks wait on their sends and receives in an order that closes a cycle. Post every receive of "
        "a step first (`dist.irecv`) and wait on the Works only after the sends are posted, or issue each "
        "step's sends and receives together with `dist.batch_isend_irecv`."
    ),
    "pipeline": (
        "The stages of a torch.distributed.pipelining schedule disagree on how many microbatches a step "
        "has (or on the schedule): one stage still sends or waits for a microbatch the other has not or "
        "no longer will. Build every stage's schedule with the same `n_microbatches` and the same schedule "
        "class, and give every stage batches of the same size: a rank-local batch size, or a last batch "
        "that is smaller on some ranks, changes the microbatch count (drop the last batch, or pad it)."
    ),
}


def p2p_deadlock_words(facts: dict, ranks_text, phrases: Phrases) -> tuple:
    """(summary, fix) of a point-to-point deadlock: the cycle of waits, and the fix its shape calls for."""
    shape, cycle = facts["shape"], facts["cycle"]
    summary = (
        f"A point-to-point deadlock: {ranks_text([s['rank'] for s in cycle])} wait for one another in a "
        "cycle: "
        + "; ".join(_cycle_step(step) for step in cycle)
        + ". No send, receive or collective in flight can ever be matched."
    )
    where = build.short_site(facts["location"])
    batch = any(step.get("batch") for step in cycle)
    if shape == "unmatched":
        send, recv = facts["pair"]
        expected = _p2p_half("recv", recv["peer"], recv["tag"] or 0)
        summary += (
            f" Rank {recv['rank']} waits for a message it will not get: it asked for a {expected} at "
            f"{build.short_site(recv['site'])}, while rank {send['rank']} sends to it with tag "
            f"{send['tag'] or 0} at {build.short_site(send['site'])}."
        )
        fix = (
            f"Make the receive at {where} name the source and tag the sender uses (rank {send['rank']}, tag "
            f"{send['tag'] or 0}), or the send name the ones the receiver expects; tags must be equal on both "
            "sides, and a recv with a `src` takes messages from that rank only."
        )
    elif shape == "into_collective" and facts.get("went_on"):
        summary, fix = _went_on_words(summary, facts["went_on"], where, phrases)
    elif shape == "into_collective":
        stuck = [s for s in cycle if s["kind"] != "collective"]
        waiting = "receive" if stuck and stuck[0]["kind"] == "send" else "send"
        summary += (
            f" {phrases.sentence(ranks_text([s['waits_for'] for s in stuck]))} went on to a collective without the "
            f"matching {waiting}: one side has one message more (or fewer) than the other expects."
        )
        fix = (
            f"Every send needs a matching recv on its peer before either side goes on: give both sides the same "
            f"number of sends and receives (in a pipeline, the same number of microbatches on every stage; in a "
            f"loop, the same number of iterations), or remove the extra exchange at {where}; a collective after "
            "the exchanges must come after the last one on every rank." + (_BATCHES_PAIR if batch else "")
        )
    else:
        fix = _P2P_FIXES[shape] + (_BATCHES_PAIR if batch and shape != "pipeline" else "")
        if shape == "pipeline":
            summary += (
                f" These are the sends and receives of torch.distributed.pipelining's schedule, run from "
                f"{build.short_site(facts['location'])}."
            )
    return summary, fix


def _went_on_words(summary: str, went_on: list, where: str, phrases: Phrases) -> tuple:
    """(summary, fix) where the counts show which rank went on to a collective without its send (or recv)."""
    clauses, exits = [], []
    for gone in went_on:
        half, other = gone["half"], "recv" if gone["half"] == "send" else "send"
        to, back = ("to", "from") if half == "send" else ("from", "to")
        clauses.append(
            f"rank {gone['rank']} went on to a collective without the {half} rank {gone['peer']} waits for: it "
            f"began {gone['count']} {half}(s) {to} rank {gone['peer']}, rank {gone['peer']} began "
            f"{gone['peer_count']} {other}(s) {back} it (observed in the run)"
        )
        left = gone["exit"]
        whose = "its own" if left["half_of"] == gone["rank"] else f"rank {left['half_of']}'s, the same code"
        exits.append(
            f"Rank {gone['rank']} can leave at {build.short_site(left['site'])} (`{left['condition']}`: "
            f"{left['kind']}) before the {half} at {build.short_site(left['half_site'])} ({whose}); that it took "
            "this exit is read from the source, not observed."
        )
    summary += " " + phrases.sentence("; ".join(clauses)) + "." + "".join(" " + text for text in exits)
    gone = went_on[0]
    fix = (
        f"Make rank {gone['rank']} {gone['half']} on every path, also when it has nothing to contribute (a zero "
        f"count, or an empty tensor, that rank {gone['peer']} reads first), so that every "
        f"{'recv' if gone['half'] == 'send' else 'send'} has its {gone['half']}; "
        f"or replace the exchange with a collective every rank joins (`all_gather_object`, `gather`). Look at "
        f"{where}."
    )
    return summary, fix
