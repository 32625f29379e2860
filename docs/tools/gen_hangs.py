"""Regenerates docs/hangs.md: runs every reproduction on 2-3 local gloo ranks and pastes the real report excerpts.

    python docs/tools/gen_hangs.py        # about 2-3 minutes on 2 cores
"""

import ast
import os
import textwrap
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from ranks import SCENARIOS, reports, run_case  # noqa: E402

HANGS = os.path.join(SCENARIOS, "hangs.py")
CATALOGUE = os.path.join(SCENARIOS, "catalogue.py")
FAULTS = os.path.join(SCENARIOS, "faults.py")
FRAMEWORKS = os.path.join(SCENARIOS, "frameworks.py")
P2P = os.path.join(SCENARIOS, "p2p.py")
DEPARTURES = os.path.join(SCENARIOS, "departures.py")
SILENT = os.path.join(SCENARIOS, "silent.py")

# kind, title, symptom, reproduction (file, function), command args, ranks, extra env, stop when a report exists
SECTIONS = [
    ("ddp_forward_on_subset", "The DDP model called on some ranks only (the seed)",
     "Rank-0-only validation calls the DistributedDataParallel wrapper; the job stalls at the next barrier.",
     (os.path.join(ROOT, "ddpwatch", "examples", "seed_stall.py"), "validation"),
     ["-m", "ddpwatch.examples.seed_stall"], 2, {}, False),
    ("ddp_forward_on_subset", "... and its twin: the one-time bucket rebuild",
     "A buffer-less model, called with grad enabled on rank 0 after the first backward: DDP's bucket rebuild "
     "broadcasts.", (CATALOGUE, "rebuild"), [CATALOGUE, "rebuild"], 2, {}, False),
    ("collective_on_subset", "A collective under a rank condition",
     "`if rank == 0: dist.all_reduce(...)`: rank 0 waits in all_reduce, the others in the next barrier.",
     (HANGS, "collective_on_subset"), [HANGS, "collective_on_subset"], 2, {}, False),
    ("skipped_collective", "A collective skipped by an early continue/return",
     "One rank `continue`s past the epoch-end barrier and runs into the next epoch's DDP forward.",
     (CATALOGUE, "skipped"), [CATALOGUE, "skipped"], 2, {}, False),
    ("uneven_inputs", "Ranks with different numbers of batches",
     "Rank 0 has one batch more; its extra backward() all-reduces gradients that nobody else sends.",
     (CATALOGUE, "uneven"), [CATALOGUE, "uneven"], 2, {}, False),
    ("local_decision", "A loop left by one rank's own decision: early stopping on a local loss",
     "Each rank feeds its own validation loss to its own early-stopping monitor; rank 0 runs out of patience and "
     "`break`s out of the epoch loop while rank 1 trains on. Not uneven data: every rank ran the same steps per "
     "epoch (`EarlyStopping` and `local_val_loss` are in the same file).",
     (DEPARTURES, "early_stop"), [DEPARTURES, "early_stop"], 2, {}, False),
    ("local_decision", "... and a NaN check that returns on one rank",
     "Rank 1's third batch holds a corrupt sample; its loss is not finite and `train_until_nan` returns between "
     "forward and backward, while rank 0 goes on to backward (the caller then waits in a barrier).",
     (DEPARTURES, "train_until_nan"), [DEPARTURES, "nan_return"], 2, {}, False),
    ("caught_exception", "An exception caught on one rank skips backward",
     "`try: ... except ValueError: continue` around the forward and the loss: rank 1's batch raises after DDP's "
     "forward broadcast the buffers, so rank 1 skips backward's gradient all-reduce and runs the next forward.",
     (DEPARTURES, "caught"), [DEPARTURES, "caught"], 2, {}, False),
    ("shape_mismatch", "Different tensor sizes in the same collective",
     "Rank 1 passes an empty tensor to all_reduce; on gloo it returns at once while rank 0 waits forever.",
     (CATALOGUE, "shape"), [CATALOGUE, "shape"], 2, {}, False),
    ("group_order", "Two process groups used in opposite orders",
     "Rank 0 all-reduces on group A then B, rank 1 on B then A.",
     (CATALOGUE, "group_order"), [CATALOGUE, "group_order"], 2, {}, False),
    ("p2p_deadlock", "Point-to-point: every rank sends first",
     "A halo exchange written send-then-recv: gloo's (and NCCL's) send waits for the matching recv.",
     (P2P, "send_first"), [P2P, "send_first"], 3, {}, False),
    ("p2p_deadlock", "Point-to-point: a recv that names another tag",
     "Rank 0 sends with tag 7, rank 1 receives with tag 8.", (P2P, "wrong_tag"), [P2P, "wrong_tag"], 2, {}, False),
    ("p2p_deadlock", "Point-to-point: a stage with one microbatch more",
     "A hand-written two-stage pipeline: stage 0 sends 4 microbatches, stage 1 receives 3 and goes on to an "
     "all_reduce.", (P2P, "microbatches"), [P2P, "microbatches"], 2, {}, False),
    ("p2p_deadlock", "Point-to-point: a helper returns before its send",
     "Rank 0 receives every other rank's error report in turn; `_report_errors(errors)` returns at once when "
     "`errors` is empty (`if not errors: return`, before its `dist.send`), so a rank with nothing to report goes "
     "on to the barrier while rank 0 waits for its count.", (P2P, "errors_return"), [P2P, "errors_return"], 3, {},
     False),
    ("p2p_deadlock", "torch.distributed.pipelining: stages with different microbatch counts",
     "Each stage builds its ScheduleGPipe with a rank-local `n_microbatches` (4 on stage 0, 2 on stage 1).",
     (P2P, "_pipeline"), [P2P, "pipeline_microbatches"], 2, {}, False),
    ("silent_mismatch", "Collectives that completed with different dtypes (nothing hangs)",
     "A counter kept as int32 on rank 1 and float32 on rank 0: the same bytes, so gloo lets it through and rank 1 "
     "reads floats as integers. Reported within about 2 s of the position; the job goes on (action=report).",
     (SILENT, "float_against_int"), [SILENT, "float_against_int"], 2, {}, False),
    ("crossed_collectives", "Metric helpers called in a rank-dependent order (nothing hangs)",
     "Rank 0 reduces the loss then the histogram, rank 1 the other way round: same shapes, so the values are "
     "exchanged between the variables.", (SILENT, "crossed"), [SILENT, "crossed"], 2, {}, False),
    ("mismatch_crash", "A size mismatch the backend aborts",
     "Per-rank logging helpers meet at one position: 8 floats in `log_hist()` on rank 0, 4 in `log_loss()` on rank "
     "1. gloo aborts rank 1 (SIGABRT, no Python traceback); its fault file gives its stack to the survivor.",
     (SILENT, "sizes"), [SILENT, "sizes"], 2, {}, False),
    ("straggler", "A rank that is merely slow",
     "Rank 0 works outside collectives for longer than the timeout (here 4 s) while rank 1 waits.",
     (HANGS, "busy"), [HANGS, "busy:60"], 2, {"DDPWATCH_TIMEOUT": 4}, False),
    ("collective_stuck", "A collective that never completes anywhere",
     "Every rank is in the same all_reduce at the same position and the transport never delivers "
     "(simulated: the all_reduce blocks forever on every rank).", (CATALOGUE, "stuck"),
     [CATALOGUE, "stuck"], 2, {"DDPWATCH_TIMEOUT": 4}, False),
    ("dead_rank", "A rank that vanished",
     "Rank 1 exits (here: os._exit) while rank 0 waits in a collective it never joins.",
     (CATALOGUE, "dead"), [CATALOGUE, "dead"], 3, {"DDPWATCH_DEAD_AFTER": 4}, False),
    ("unresponsive_rank", "A rank that is there but frozen",
     "Rank 1 is stopped (SIGSTOP) before a barrier.", (CATALOGUE, "unresponsive"),
     [CATALOGUE, "unresponsive"], 2, {"DDPWATCH_DEAD_AFTER": 4, "DDPWATCH_ACTION": "report"}, True),
]

# The same hangs as the code people run writes them: Lightning, Accelerate, FSDP2, DTensor, functional collectives.
FRAMEWORK_SECTIONS = [
    ("collective_on_subset", "Lightning: `self.log(..., sync_dist=True)` on global zero only",
     "The metric is reduced later, at the end of the validation epoch, from inside the trainer: rank 0 waits in "
     "Lightning's reduction, rank 1 in Lightning's own per-batch broadcast.",
     (FRAMEWORKS, "lightning_log_sync_rank0"), [FRAMEWORKS, "lightning_log_sync_rank0"], 2, {}, False),
    ("collective_on_subset", "Lightning: `trainer.strategy.barrier()` in a callback, on global zero only",
     "A lone barrier on rank 0; rank 1 goes on training.",
     (FRAMEWORKS, "lightning_barrier_rank0"), [FRAMEWORKS, "lightning_barrier_rank0"], 2, {}, False),
    ("collective_on_subset", "Lightning: a collective inside a `@rank_zero_only` function",
     "`strategy.broadcast` called from a function that only rank zero runs.",
     (FRAMEWORKS, "lightning_rank_zero_only"), [FRAMEWORKS, "lightning_rank_zero_only"], 2, {}, False),
    ("collective_on_subset", "Accelerate: `wait_for_everyone()` on the main process only",
     "`if accelerator.is_main_process: accelerator.wait_for_everyone()`.",
     (FRAMEWORKS, "accelerate_wait_rank0"), [FRAMEWORKS, "accelerate_wait_rank0"], 2, {}, False),
    ("collective_on_subset", "Accelerate: `gather` on the main process only",
     "Gathering predictions for a metric inside `if accelerator.is_main_process:`.",
     (FRAMEWORKS, "accelerate_gather_rank0"), [FRAMEWORKS, "accelerate_gather_rank0"], 2, {}, False),
    ("collective_on_subset", "FSDP2: evaluating the sharded model on rank 0 only",
     "A `fully_shard` model's forward all-gathers its parameters; rank 0 evaluates alone.",
     (FRAMEWORKS, "fsdp2_eval_rank0"), [FRAMEWORKS, "fsdp2_eval_rank0"], 2, {}, False),
    ("collective_on_subset", "DTensor: redistributing on rank 0 only",
     "`full_tensor()` of a sharded DTensor issues a functional all-gather.",
     (FRAMEWORKS, "dtensor_rank0"), [FRAMEWORKS, "dtensor_rank0"], 2, {}, False),
    ("collective_on_subset", "A collective Python never sees (compiled graphs, `torch.ops`)",
     "`torch.ops._c10d_functional.all_reduce` on rank 0 only: taken from torch's Flight Recorder.",
     (FRAMEWORKS, "ops_rank0"), [FRAMEWORKS, "ops_rank0"], 2, {}, False),
    ("skipped_collective", "A barrier skipped after a matched checkpoint barrier",
     "Every rank ran the same steps and met the checkpoint barrier; rank 1 then `continue`s past the epoch-end "
     "barrier. Not uneven inputs: the ranks left the training loop together.",
     (FRAMEWORKS, "skip_after_checkpoint"), [FRAMEWORKS, "skip_after_checkpoint"], 2, {}, False),
]

FRAMEWORKS_INTRO = """# Frameworks

The same mistakes written with Lightning, Accelerate, FSDP2, DTensor and functional collectives
(`tests/scenarios/frameworks.py`, run by `tests/test_real_frameworks.py`). Frames of installed frameworks are never
taken for your line; the culprit comes from the rank conditions on each rank's own code, and the fix is given in
the framework's terms.
"""

FIXES_INTRO = """# The hang catalogue

Every common way distributed PyTorch training hangs, what ddpwatch says about it, and the fix. Each excerpt below
is the start of a real `report.txt`, produced by `python docs/tools/gen_hangs.py` from the reproductions in
`tests/scenarios/` (the same ones the real tests run), on 2-3 CPU ranks with gloo. Paths are shortened to the
repository. The verdict names the culprit rank (never the ranks innocently waiting), the user's line, and the fix.
"""


def function_source(path, name):
    """The source of the first function or method called `name` in the file, dedented."""
    with open(path) as handle:
        text = handle.read()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return textwrap.dedent("\n".join(text.splitlines()[node.lineno - 1:node.end_lineno]))
    return ""


def excerpt(report_text):
    lines = report_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("["))
    out = []
    for line in lines[start:]:
        if line.startswith("Mismatched collectives") or line.startswith("Main-thread stack"):
            break
        out.append(line)
    return "\n".join(out).rstrip().replace(ROOT + "/", "")


def section(kind, title, symptom, path, function, args, nprocs, env, stop) -> str:
    folder = tempfile.mkdtemp()
    env = dict({"DDPWATCH_ACTION": "abort", "FRAMEWORKS_ROOT_DIR": folder}, **env)
    run_case(args, nprocs, folder, timeout=90, stop_when=(lambda f=folder: bool(reports(f))) if stop else None,
             **env)
    found = reports(folder)
    text = excerpt(open(os.path.join(os.path.dirname(found[0]), "report.txt")).read()) if found else "NO REPORT"
    print(kind, function, "ok" if found else "NO REPORT", flush=True)
    return (f"## `{kind}`: {title}\n\n**Symptom.** {symptom}\n\n**Reproduction** "
            f"(`{os.path.relpath(path, ROOT)}`):\n\n```python\n{function_source(path, function)}\n```\n\n"
            f"**What ddpwatch reports:**\n\n```\n{text}\n```\n")


def main():
    parts = [FIXES_INTRO]
    for kind, title, symptom, (path, function), args, nprocs, env, stop in SECTIONS:
        parts.append(section(kind, title, symptom, path, function, args, nprocs, env, stop))
    parts.append(FRAMEWORKS_INTRO)
    for kind, title, symptom, (path, function), args, nprocs, env, stop in FRAMEWORK_SECTIONS:
        parts.append(section(kind, title, symptom, path, function, args, nprocs, env, stop))
    with open(os.path.join(ROOT, "docs", "hangs.md"), "w") as handle:
        handle.write("\n".join(parts))


if __name__ == "__main__":
    main()
