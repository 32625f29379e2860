"""The English of a report: how an op, a rank list and each finding kind are said (analysis hands over facts only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, overload

from ..format import build
from .basis_words import worded_basis
from .ranks_text import rank_list
from .mismatch_words import crossed_collectives, mismatch_crash, side_text, silent_mismatch
from .departures import Phrases, caught_exception_words, local_decision_words
from .p2p_words import p2p_deadlock_words, p2p_text

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import Incident


def describe_op(record: Mapping[str, Any]) -> str:
    """'broadcast (DDP buffer sync) inside DistributedDataParallel.forward called at val.py:42'."""
    if record.get("p2p"):
        return f"{p2p_text(record)} at {build.short_site(record.get('site'))}"
    text = record["op"]
    api = record.get("api")
    if api == build.DDP_BUFFER_BROADCAST:
        text += " of module buffers"
    elif api == build.DDP_GRAD_ALLREDUCE:
        return f"{text} of gradients inside backward() at {build.short_site(record.get('site'))}"
    elif api == build.DDP_BUCKET_REBUILD:
        text += " for DDP's gradient bucket rebuild"
    elif api == build.FLIGHT_RECORDER_ONLY:
        text += " (seen by torch's Flight Recorder only: issued outside Python, e.g. compiled code or torch.ops)"
    elif api and api != record["op"]:
        text += f" ({api})"
    framework = record.get("framework") or {}
    via = record.get("via")
    if framework.get("description"):
        text += f" of {framework['description']}"
    elif via:
        text += f" via {via.get('function')} ({via.get('package')})"
    region = record.get("region")
    if region and region.get("kind") == build.DDP_FORWARD:
        return f"{text} inside DistributedDataParallel.forward called at {build.short_site(region.get('site'))}"
    if region and region.get("kind") == build.FSDP_FORWARD:
        return f"{text} inside FSDP2's forward (fully_shard) called at {build.short_site(region.get('site'))}"
    if region and region.get("kind") == build.OBJECT_COLLECTIVE:
        return f"{text} inside {region.get('api')} at {build.short_site(region.get('site') or record.get('site'))}"
    return f"{text} at {build.short_site(record.get('site'))}"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verb(ranks, one: str, many: str) -> str:
    return one if len(set(ranks)) == 1 else many


# render/departures.py words local_decision and caught_exception; it imports nothing of this module (which imports
# it), so it is handed the phrases it shares with every other kind.
_PHRASES = Phrases(describe=describe_op, sentence=_sentence, verb=_verb)


def _waits_text(parts, ranks_text=rank_list) -> str:
    return "; ".join(f"{ranks_text(r)} {_verb(r, 'waits', 'wait')} in {describe_op(rec)}" for r, rec in parts)


def _shape_text(record: Mapping[str, Any]) -> str:
    shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in record.get("shapes") or ()) or "no tensor"
    return f"{shapes} {','.join(record.get('dtypes') or ())}".strip()


# Fixes in the framework's own words: (package, method name the user's code called) -> the fix. `{cond}` is the
# rank condition's text, `{line}` the user's line.
FRAMEWORK_FIXES = {
    ("lightning", "barrier"): "Call `trainer.strategy.barrier()` on every rank: move it out of `{cond}` at {line} "
    "(a barrier only some ranks reach waits forever).",
    ("lightning", "broadcast"): "Call `trainer.strategy.broadcast(...)` on every rank (it is a collective): move it "
    "out of `{cond}` at {line}, and use the result on the rank that needs it.",
    ("lightning", "reduce"): "Call the reduction (`trainer.strategy.reduce`, `self.all_gather`) on every rank: move it "
    "out of `{cond}` at {line}.",
    ("lightning", "all_gather"): "Call `self.all_gather(...)` on every rank: move it out of `{cond}` at {line}, then "
    "use the result on rank zero only.",
    ("lightning", "log"): "Call `self.log(..., sync_dist=True)` on every rank, or log on rank zero only with "
    "`self.log(..., rank_zero_only=True)` and without sync_dist (at {line}).",
    ("accelerate", "wait_for_everyone"): "Call `accelerator.wait_for_everyone()` on every process: move it out of "
    "`{cond}` at {line}.",
    ("accelerate", "gather"): "Call `accelerator.gather(...)` on every process (it is a collective): move it out "
    "of `{cond}` at {line} and use the result on the main process only.",
    ("accelerate", "gather_for_metrics"): "Call `accelerator.gather_for_metrics(...)` on every process: move it "
    "out of `{cond}` at {line} and compute the metric on the main process only.",
    ("accelerate", "reduce"): "Call `accelerator.reduce(...)` on every process: move it out of `{cond}` at {line}.",
    ("accelerate", "broadcast"): "Call the broadcast on every process: move it out of `{cond}` at {line}.",
}


def framework_fix(
    record: Mapping[str, Any], location: Mapping[str, Any] | None, condition: Mapping[str, Any] | None
) -> str | None:
    """The fix for a collective a framework issued for the user, in that framework's terms; None if not known."""
    if str(record.get("api") or "").startswith("funcol."):
        return (
            f"A DTensor operation (`full_tensor()`, `redistribute()`, an op on sharded tensors) or a functional "
            f"collective issues a collective on every rank of its mesh or group: run the call at "
            f"{build.short_site(location)} on every rank (move it out of "
            + (f"`{condition['condition']['text']}`" if condition else "the rank-only branch")
            + "), and use its result on the rank that needs it."
        )
    if (record.get("region") or {}).get("kind") == build.FSDP_FORWARD:
        return (
            f"A fully_shard (FSDP2) model's forward all-gathers its parameters from every rank, so run the forward "
            f"at {build.short_site(location)} on every rank (evaluate on every rank and reduce the metric), or "
            "build an unsharded copy for rank-local work: on every rank take `model.state_dict()` and call "
            "`.full_tensor()` on each DTensor, then load it into a plain model used on one rank only."
        )
    via = record.get("via") or {}
    framework = record.get("framework") or {}
    package = str(framework.get("framework") or via.get("package") or "")
    method = str(framework.get("call") or via.get("function") or "").rsplit(".", 1)[-1]
    for (known_package, known_method), text in FRAMEWORK_FIXES.items():
        if package.startswith(known_package) and method == known_method:
            cond = condition["condition"]["text"] if condition else "the rank-only branch"
            return text.format(cond=cond, line=build.short_site(location))
    return None


# ---------------------------------------------------------------- the sentences of each kind, from its facts


def where_last_seen(facts: dict) -> str:
    """Where a silent rank was last: in its collective, at its line, or what is known of it."""
    if facts.get("record"):
        return "in " + describe_op(facts["record"])
    if facts.get("here"):
        return "at " + build.short_site(facts["here"])
    if facts.get("published"):
        return "outside collectives (it could not be asked for a stack)"
    return "nowhere known: it never published its state"


def _dead_rank(facts: dict, ranks_text=rank_list) -> tuple:
    remote, gone = facts["remote"], facts["exists"] is False
    summary = (
        f"Rank {facts['rank']} (pid {facts['pid']} on {facts['host']}) "
        f"{'is silent' if remote else 'is gone'}: its heartbeat stopped {facts['silent_s']:.0f} s ago"
        + (" and the process no longer exists" if gone else "")
        + f"; it was last {where_last_seen(facts)}."
        + (
            " It runs on another host, where ddpwatch cannot look at the process: it cannot tell a "
            "dead or frozen rank from one busy in a long call that holds the GIL (which silences the "
            "heartbeat too)."
            if remote
            else ""
        )
    )
    fix = (
        "Find why the process died: its own log (out-of-memory killer, segfault, an exception), "
        "`dmesg`, and the launcher's exit summary. The other ranks will wait forever for it."
    )
    return summary, fix


def _unresponsive_rank(facts: dict, ranks_text=rank_list) -> tuple:
    summary = (
        f"Rank {facts['rank']} (pid {facts['pid']}) exists but has not answered for {facts['silent_s']:.0f} s "
        f"(process status: {facts['status']}); neither its training thread nor ddpwatch's watchdog moves. "
        f"It was last {where_last_seen(facts)}."
    )
    fix = (
        "A stopped (SIGSTOP, Ctrl-Z), traced (a debugger) or dead process runs no code until it is "
        "resumed: check its state with `cat /proc/<pid>/status` and `py-spy dump --native --pid`; resume "
        "(kill -CONT) or restart it."
    )
    return summary, fix


def _group_order(facts: dict, ranks_text=rank_list) -> tuple:
    summary = (
        "The ranks issue collectives on different process groups in different orders: "
        + "; ".join(
            f"{ranks_text(r)} {_verb(r, 'waits', 'wait')} on group {g} in {describe_op(record)}"
            for g, r, record in facts["groups"]
        )
        + ". Each group needs a rank that is blocked on the other, so neither can finish."
    )
    fix = (
        "Issue collectives on every process group in the same order on all ranks (for example, always the "
        "data-parallel group before the model-parallel one); do not let rank-dependent branches reorder them."
    )
    return summary, fix


def _shape_mismatch(facts: dict, ranks_text=rank_list) -> tuple:
    record, culprits = facts["record"], facts["culprits"]
    shapes = "; ".join(f"{ranks_text(r)}: {_shape_text(rec)}" for r, rec in facts["parts"])
    summary = (
        f"{_sentence(ranks_text(culprits))} passed different tensors to {record['op']} at "
        f"{build.short_site(record.get('site'))} (group {record['group']}, seq {record['seq']}): {shapes}. "
        "On gloo an empty tensor returns at once on its rank while the others wait forever; other size "
        "differences abort or corrupt."
    )
    fix = (
        f"Make the tensor passed at {build.short_site(facts['location'])} the same shape and dtype on every rank "
        "(pad variable-length data, or all_gather the sizes first and then the padded tensors)."
    )
    return summary, fix


def _ddp_forward_on_subset(facts: dict, ranks_text=rank_list) -> tuple:
    culprits, others, call_site = facts["culprits"], facts["others"], facts["call_site"]
    if facts["rebuild"]:
        why = (
            "DDP rebuilds its gradient buckets once, on the first grad-enabled forward after the first backward, "
            "and that rebuild broadcasts across all ranks"
        )
        short_why = "the one-time gradient bucket rebuild in DDP.forward is a broadcast every rank must join"
    else:
        why = (
            "DDP's forward broadcasts the module's buffers (such as BatchNorm running statistics) from rank 0 "
            "to every rank before computing, so every rank must run it"
        )
        short_why = "DDP.forward broadcasts BatchNorm statistics and other buffers to every rank"
    summary = (
        f"{_sentence(ranks_text(culprits))} called the DistributedDataParallel model at "
        f"{build.short_site(call_site)} ({build.format_site(call_site)}) while {ranks_text(others)} did not: "
        f"{why}. {_sentence(ranks_text(culprits))} {_verb(culprits, 'blocks', 'block')} in "
        f"{describe_op(facts['record'])}; {_waits_text(facts['waits'], ranks_text)}. "
        "Neither side can ever finish."
    )
    fix = (
        f"For rank-local work (evaluation, logging) call the wrapped module directly: `model.module(x)` instead of "
        f"`model(x)` at {build.short_site(call_site)}; or run that forward on every rank ({short_why})."
    )
    return summary, fix


def _collective_on_subset(facts: dict, ranks_text=rank_list) -> tuple:
    culprits, record, location, innocent = facts["culprits"], facts["record"], facts["location"], facts["innocent"]
    if innocent is None:
        elsewhere = "never reach: they exited"
    else:
        ranks, waited = innocent
        elsewhere = (
            f"{_verb(ranks, 'does', 'do')} not call at this point: "
            f"{_verb(ranks, 'it waits', 'they wait')} in {describe_op(waited)}"
        )
    others = ranks_text(innocent[0]) if innocent is not None else "the other ranks"
    summary = (
        f"{_sentence(ranks_text(culprits))} called {describe_op(record)} ({build.format_site(location)}), "
        f"which {others} {elsewhere}. Neither side can ever finish."
    )
    condition = facts["condition"]
    fix = framework_fix(record, location, condition) or (
        f"Run the collective at {build.short_site(location)} on every rank of the group (move it out of "
        + (f"the rank-only branch `{condition['condition']['text']}`" if condition else "any rank-only branch")
        + "), or give it a process group made of only the ranks that call it (`dist.new_group(ranks=...)`)."
    )
    return summary, fix


def _skipped_collective(facts: dict, ranks_text=rank_list) -> tuple:
    culprits, (waiting, skipped), now = facts["culprits"], facts["innocent"], facts["culprit_record"]
    summary = (
        f"{_sentence(ranks_text(culprits))} never reached {describe_op(skipped)}, where "
        f"{ranks_text(waiting)} {_verb(waiting, 'waits', 'wait')}: "
        f"{_verb(culprits, 'it', 'they')} went past it and {_verb(culprits, 'is', 'are')} now "
        f"{'in ' + describe_op(now) if now else 'gone (the rank exited)'}."
    )
    fix = (
        f"Every rank must reach the collective at {build.short_site(facts['location'])}: look for an early "
        "`return`, `continue` or `break` taken on some ranks only (often under a rank condition) before it, and "
        "move the collective above it or make the exit happen on every rank."
    )
    exit_ = facts.get("exit")
    if exit_:
        fix += (
            f" Here it is the exit at line {exit_['condition'].get('exit_line')} under "
            f"`{exit_['condition']['text']}` ({build.short_site(exit_['frame'])})."
        )
    return summary, fix


def _uneven_inputs(facts: dict, ranks_text=rank_list) -> tuple:
    culprits, record, (waiting, waited) = facts["culprits"], facts["record"], facts["innocent"]
    summary = (
        f"{_sentence(ranks_text(culprits))} {_verb(culprits, 'is', 'are')} still training "
        f"({describe_op(record)}) while {ranks_text(waiting)} finished the loop and "
        f"{_verb(waiting, 'waits', 'wait')} in {describe_op(waited)}: the ranks ran different "
        "numbers of training steps, so the extra step's collectives have no partner."
    )
    fix = (
        "Give every rank the same number of batches: use `DistributedSampler(dataset, drop_last=True)` (or pad "
        "the dataset to a multiple of the world size), or wrap the loop in DDP's `with model.join():` context "
        "manager, which lets ranks that run out of data shadow the others' collectives."
    )
    return summary, fix


def _local_decision(facts: dict, ranks_text=rank_list) -> tuple:
    return local_decision_words(facts, ranks_text, _PHRASES)


def _caught_exception(facts: dict, ranks_text=rank_list) -> tuple:
    return caught_exception_words(facts, ranks_text, _PHRASES)


def _collective_mismatch(facts: dict, ranks_text=rank_list) -> tuple:
    if facts.get("below") is not None:
        return _different_positions(facts, ranks_text)
    calls = "; ".join(f"{ranks_text(r)}: {describe_op(rec)} (seq {rec['seq']})" for r, rec in facts["parts"])
    summary = (
        f"The ranks issued different collectives at the same point of group {facts['group']}: {calls}. "
        "They can never match."
    )
    fix = (
        "Make every rank issue the same collectives in the same order on each process group; look for a "
        "branch on rank, data or configuration that changes which collective runs."
    )
    return summary, fix


def _different_positions(facts: dict, ranks_text=rank_list) -> tuple:
    summary = (
        f"On group {facts['group']} the ranks wait at different positions: "
        + "; ".join(f"{ranks_text(r)} at seq {rec['seq']} ({describe_op(rec)})" for r, rec in facts["parts"])
        + f". {_sentence(ranks_text(facts['ahead']))} got past seq {facts['below']} without the others."
    )
    fix = (
        "Some collective completed on part of the group only (on gloo: an empty tensor); compare the ranks' "
        "collectives just before these lines and make them identical."
    )
    return summary, fix


def _p2p_deadlock(facts: dict, ranks_text=rank_list) -> tuple:
    return p2p_deadlock_words(facts, ranks_text, _PHRASES)


def _collective_stuck(facts: dict, ranks_text=rank_list) -> tuple:
    record = facts["record"]
    summary = (
        f"All {facts['count']} ranks have waited {facts['wait_s']:.0f} s in the same collective, "
        f"{describe_op(record)} (group {record['group']}, seq {record['seq']}), and it does not complete: "
        "the program agrees, the transport does not (network, device or library fault)."
    )
    fix = (
        "Check the interconnect and devices: NCCL_DEBUG=INFO logs, `nvidia-smi`, network between hosts "
        "(firewalls, wrong interface: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME); if the op is huge, raise the "
        "timeout."
    )
    return summary, fix


def _straggler(facts: dict, ranks_text=rank_list) -> tuple:
    location = facts["location"]
    where = f" (now at {build.format_site(location)})" if location else ""
    summary = (
        f"{_sentence(ranks_text(facts['waiting']))} waited {facts['wait_s']:.0f} s, longer than the "
        f"{facts['timeout']:g} s timeout, in {describe_op(facts['record'])}, while {ranks_text(facts['busy'])} "
        f"kept working outside collectives{where}. This is a straggler, not a proven deadlock: the wait ends "
        "if the busy ranks reach the collective."
    )
    fix = (
        "If this work is expected (long validation or checkpointing on one rank), raise ddpwatch's timeout or "
        "spread the work across ranks; otherwise the stack below shows where the busy ranks are stuck."
    )
    return summary, fix


# Every finding kind's sentences: kind -> ((its facts, how a rank list is said) -> (summary, fix)). report.json's
# summary says rank lists in full (rank_list); report.txt and report.html pass short_rank_list. A new kind is a row
# here too (tests/test_finding_table.py fails on a kind of analysis.FINDING_KINDS without one).
SENTENCES = {
    "dead_rank": _dead_rank,
    "unresponsive_rank": _unresponsive_rank,
    "group_order": _group_order,
    "shape_mismatch": _shape_mismatch,
    "ddp_forward_on_subset": _ddp_forward_on_subset,
    "collective_on_subset": _collective_on_subset,
    "skipped_collective": _skipped_collective,
    "uneven_inputs": _uneven_inputs,
    "local_decision": _local_decision,
    "caught_exception": _caught_exception,
    "collective_mismatch": _collective_mismatch,
    "collective_stuck": _collective_stuck,
    "straggler": _straggler,
    "p2p_deadlock": _p2p_deadlock,
    "silent_mismatch": silent_mismatch,
    "crossed_collectives": crossed_collectives,
    "mismatch_crash": mismatch_crash,
}


# Point-to-point code runs under rank conditions by nature (`if rank == 0: send`): naming one explains nothing.
WITHOUT_CONDITION_HINT = frozenset({"p2p_deadlock"})


def _rank_condition_text(evidence: dict | None) -> str:
    """The hint that the culprit's line runs under a rank condition (evidence the incident builder added)."""
    conditions = (evidence or {}).get("rank_condition")
    if not conditions:
        return ""
    first = next(iter(conditions.values()))
    where = build.short_site({"file": first["frame"]["file"], "line": first["condition"]["line"]})
    return f" That line runs only under the rank condition `{first['condition']['text']}` ({where})."


def _described_evidence(evidence: dict, facts: dict) -> dict:
    """The evidence with its words filled in: each mismatched row's description, where a silent rank was, ..."""
    filled = dict(evidence)
    if "mismatched" in filled and facts.get("sides") is not None:  # silent_mismatch: the completed calls
        filled["mismatched"] = [
            dict(row, description=side_text(side)) for row, side in zip(filled["mismatched"], facts["sides"])
        ]
    elif "mismatched" in filled and facts.get("side") is not None:
        filled["mismatched"] = [
            dict(row, description=describe_op(record)) for row, record in zip(filled["mismatched"], facts["side"])
        ]
    if "last_seen" in filled:
        filled["last_seen"] = where_last_seen(facts)
    if "culprits_now" in filled:
        now = facts.get("culprit_record")
        filled["culprits_now"] = describe_op(now) if now else "exited"
    return filled


def _sentences(kind: str, facts: dict, evidence: dict | None, ranks_text) -> tuple:
    """(summary, fix) of a finding from its facts, the rank-condition hint at the summary's end."""
    summary, fix = SENTENCES[kind](facts, ranks_text)
    if kind in WITHOUT_CONDITION_HINT:
        return summary, fix
    return summary + _rank_condition_text(evidence), fix


def worded(finding: dict) -> dict:
    """A finding as report.json carries it: kind, ranks, summary, fix, location, evidence (words filled in), facts.

    A finding read back from a document is worded already (it has a summary): it is kept as it is.
    """
    facts = finding.get("facts")
    if facts is None or "summary" in finding:
        return finding
    evidence = finding.get("evidence")
    summary, fix = _sentences(finding["kind"], facts, evidence, rank_list)
    return {
        "kind": finding["kind"],
        "ranks": finding["ranks"],
        "summary": summary,
        "fix": fix,
        "location": finding.get("location"),
        "evidence": _described_evidence(evidence, facts) if evidence is not None else None,
        "facts": _json_shaped(facts),
        **({"basis": worded_basis(basis, finding["kind"])} if isinstance(basis := finding.get("basis"), dict) else {}),
    }


def _json_shaped(value):
    """Facts as report.json holds them (tuples as lists, keys as strings): a worded incident equals its file, and
    report.txt and report.html word the same facts whether live or read back."""
    if isinstance(value, dict):
        return {str(key): _json_shaped(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_shaped(item) for item in value]
    return value


def _unworded(finding) -> bool:
    return isinstance(finding, dict) and "facts" in finding and "summary" not in finding


@overload
def worded_incident(incident: Incident) -> Incident: ...
@overload
def worded_incident(incident: dict) -> dict: ...
def worded_incident(incident: Mapping[str, Any]) -> Mapping[str, Any]:
    """The incident with every finding worded (the same object when none needs it): an Incident stays one (its
    findings worded as report.json has them), a plain dict (a document read back) a dict."""
    findings = incident.get("findings")
    if not findings or not any(_unworded(f) for f in findings):
        return incident
    return dict(incident, findings=[worded(f) if isinstance(f, dict) else f for f in findings])


def summary_for_people(finding: dict, ranks_text) -> str:
    """A worded finding's summary said again from its facts with `ranks_text` (report.txt and report.html pass the
    short rank lists); its stored summary when it has no facts (a report.json from before they were kept) or when
    they cannot be worded."""
    facts = finding.get("facts")
    if not isinstance(facts, dict):
        return finding["summary"]
    try:
        return _sentences(finding["kind"], facts, finding.get("evidence"), ranks_text)[0]
    except Exception:  # facts read from a file are anyone's: whatever breaks the words, the stored ones still stand
        return finding["summary"]
