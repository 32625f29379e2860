"""render_text / render_json of incident documents built from hand-made traces. No torch."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import (
    DDP_FILE,
    TORCH_FILE,
    barrier,
    ddp_broadcast,
    done,
    frame,
    incident,
    main_stack,  # noqa: E402
    rank_state,
    seed_states,
    states,
    wrapped_stack,
)

from ddpwatch import analysis  # noqa: E402
from ddpwatch.format import build, documents  # noqa: E402
from ddpwatch.render import stack_lines_shown  # noqa: E402
from ddpwatch.render.json_report import render_json  # noqa: E402
from ddpwatch.render.text import render_text  # noqa: E402

GRACE, TIMEOUT_S = 2.0, 300.0
STACK_FRAME_PREFIXES = ("  > ", "    /")


def seed_incident(world_size=2, run_id="20250101-120000", **kw):
    st = seed_states(world_size)
    findings = analysis.assess(st, world_size, GRACE, TIMEOUT_S).findings
    assert [f["kind"] for f in findings] == ["ddp_forward_on_subset"]
    return incident(st, findings, run_id=run_id, **kw)


def long_lines(text):
    return [line for line in text.splitlines() if len(line) > 80 and not line.startswith(STACK_FRAME_PREFIXES)]


def section(text, title):
    """The lines of one section: from its title to the next blank line."""
    lines = text.splitlines()
    start = lines.index(title)
    end = lines.index("", start)
    return lines[start + 1 : end]


def test_text_starts_with_the_verdict():
    text = render_text(seed_incident())
    lines = text.splitlines()
    assert lines[1].startswith("ddpwatch report 20250101-120000: 2 ranks, trigger deadlock, written by rank 0")
    # The verdict is the first thing after the header: kind, culprit and line.
    first = next(line for line in lines[3:] if line.strip())
    assert first == "[ddp_forward_on_subset] culprit: rank 0 at val.py:42"
    verdict_at = text.index("[ddp_forward_on_subset] culprit: rank 0")
    assert verdict_at < text.index("Where each rank stands")
    assert verdict_at < text.index("Mismatched collectives")
    assert verdict_at < text.index("Main-thread stack")
    assert text.index("model.module(") < text.index("Where each rank stands")


def test_positions_and_side_by_side_sections():
    text = render_text(seed_incident(3))
    assert section(text, "Where each rank stands:") == [
        "  ranks 1-2: barrier at train.py:88 (waiting 3 s)",
        "  rank 0: broadcast of module buffers inside DistributedDataParallel.forward",
        "  called at val.py:42 (waiting 3 s)",
    ]
    side = section(text, "Mismatched collectives, side by side:")
    assert "  rank 0: group 0 seq 11: broadcast [_broadcast_coalesced] shapes 8" in side
    assert "  ranks 1-2: group 0 seq 11: barrier [barrier] shapes -" in side


def test_stacks_show_user_frames_and_group_identical_stacks():
    text = render_text(seed_incident(3))
    assert "Main-thread stack of rank 0 (most recent call last):" in text
    assert "Main-thread stack of ranks 1-2 (most recent call last):" in text
    assert "  > /u/val.py:42 in validate" in text
    assert "  > /u/train.py:88 in train" in text


def test_ddpwatch_own_frames_fold_into_one_line_and_torch_frames_stay():
    st = seed_states(2)
    st[0]["stacks"] = [wrapped_stack()]
    doc = incident(st, analysis.assess(st, 2, GRACE, TIMEOUT_S).findings)
    stack = section(render_text(doc), "Main-thread stack of rank 0 (most recent call last):")
    assert stack[6] == "Main-thread stack of rank 1 (most recent call last):"
    assert stack[:6] == [
        "  > /u/train.py:120 in main",
        "  > /u/val.py:42 in validate",
        "    ... 3 ddpwatch frames",
        f"    {DDP_FILE}:1600 in forward",
        f"    {TORCH_FILE}:2400 in _broadcast_coalesced",
        "    ... 3 ddpwatch frames",
    ]
    # report.json keeps every frame: programs read it.
    assert json.loads(render_json(doc))["ranks"][0]["stacks"] == [wrapped_stack()]


def test_only_ddpwatch_own_frames_fold_not_its_examples_nor_torch_in_a_checkout_named_ddpwatch():
    venv_torch = "/home/u/ddpwatch/.venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py"
    frames = main_stack(
        ("/home/u/ddpwatch/ddpwatch/examples/seed_stall.py", 54, "validation"),
        ("/home/u/ddpwatch/train.py", 9, "step"),
        ("/home/u/ddpwatch/ddpwatch/capture/wrappers.py", 512, "wrapper", True),
        ("C:\\py\\Lib\\site-packages\\ddpwatch\\capture\\wrappers.py", 287, "wrapper", True),
        ("/usr/lib/python3/dist-packages/_ddpwatch_startup.py", 3, "<module>", True),
        (venv_torch, 1886, "forward", True),
    )["frames"]
    assert stack_lines_shown(frames) == [
        "  > /home/u/ddpwatch/ddpwatch/examples/seed_stall.py:54 in validation",
        "  > /home/u/ddpwatch/train.py:9 in step",
        "    ... 3 ddpwatch frames",
        f"    {venv_torch}:1886 in forward",
    ]


def test_a_run_of_library_and_ddpwatch_frames_left_out_is_named_for_both():
    frames = main_stack(
        ("train.py", 1, "main"),
        (DDP_FILE, 1600, "forward", True),
        ("/x/ddpwatch/capture/wrappers.py", 512, "wrapper", True),
        (DDP_FILE, 1700, "_pre_forward", True),
        (TORCH_FILE, 1, "a", True),
        (TORCH_FILE, 2, "b", True),
        (TORCH_FILE, 3, "c", True),
        ("<ddpwatch hot path: barrier>", 32, "barrier", True),
    )["frames"]
    assert stack_lines_shown(frames) == [
        "  > /u/train.py:1 in main",
        "    ... 3 library and ddpwatch frames",
        f"    {TORCH_FILE}:1 in a",
        f"    {TORCH_FILE}:2 in b",
        f"    {TORCH_FILE}:3 in c",
        "    ... 1 ddpwatch frame",
    ]


def test_every_line_fits_80_columns_except_stack_frames():
    text = render_text(seed_incident(3))
    assert long_lines(text) == []
    # ... and the exemption is needed: frame lines carry full paths.
    assert any(len(line) > 80 for line in text.splitlines() if line.startswith(STACK_FRAME_PREFIXES))


def test_at_1024_ranks_positions_and_stacks_are_grouped():
    text = render_text(seed_incident(1024))
    assert section(text, "Where each rank stands:")[0] == "  ranks 1-1023: barrier at train.py:88 (waiting 3 s)"
    assert len(section(text, "Where each rank stands:")) == 3  # two groups, one of them wrapped
    assert text.count("Main-thread stack of") == 2
    assert "Main-thread stack of ranks 1-1023 (most recent call last):" in text
    head = text.split("Processes:")[0]
    assert len(head.splitlines()) < 60
    assert long_lines(head) == []


def test_at_1024_ranks_the_text_stays_under_120_lines():
    """Regression: the process facts were one line per rank, so 1,024 ranks gave over 1,000 lines."""
    assert len(render_text(seed_incident(1024)).splitlines()) < 120


def test_header_fits_80_columns_with_a_job_tag():
    """Regression: a run id with a job tag (stamp-TORCHELASTIC_RUN_ID) pushed the header past 80 columns."""
    assert long_lines(render_text(seed_incident(run_id="20250101-120000-job7"))) == []


def test_side_by_side_rows_fit_80_columns():
    """Regression: the bucket-rebuild api name plus 4 shapes made an unwrapped side-by-side row."""
    st = states(
        rank_state(
            0, 2, inflight=[ddp_broadcast(api=build.DDP_BUCKET_REBUILD, shapes=[[64, 3, 7, 7], [64], [64], [64]])]
        ),
        rank_state(1, 2, inflight=[barrier()]),
    )
    doc = incident(st, analysis.assess(st, 2, GRACE, TIMEOUT_S).findings, run_id="20250101-120000")
    assert doc["findings"][0]["evidence"]["ddp_op"] == "bucket_rebuild"
    assert long_lines(render_text(doc)) == []


def test_verdict_line_fits_80_columns_with_scattered_culprits():
    """Regression: scattered culprit ranks (16 busy even ranks of 32) made the verdict line unwrapped and wide."""
    st = states(
        *[
            rank_state(r, 32, inflight=[], idle=400.0, user_line=("val.py", 40, "validate"))
            if r % 2 == 0
            else rank_state(r, 32, inflight=[barrier(age=301.0)], idle=301.0)
            for r in range(32)
        ]
    )
    findings = analysis.assess(st, 32, GRACE, TIMEOUT_S).findings
    assert [(f["kind"], f["ranks"]) for f in findings] == [("straggler", list(range(0, 32, 2)))]
    assert long_lines(render_text(incident(st, findings, trigger="timeout", run_id="r1"))) == []


def test_straggler_text():
    st = states(
        rank_state(0, 2, inflight=[], idle=400.0, user_line=("val.py", 40, "validate")),
        rank_state(1, 2, inflight=[barrier(age=301.0)], idle=301.0),
    )
    findings = analysis.assess(st, 2, GRACE, TIMEOUT_S).findings
    text = render_text(incident(st, findings, trigger="timeout", run_id="20250101-120000"))
    assert next(line for line in text.splitlines()[3:] if line.strip()) == "[straggler] culprit: rank 0 at val.py:40"
    assert "  rank 0: busy outside collectives at val.py:40 (for 400 s)" in text
    assert "  rank 1: barrier at train.py:88 (waiting 301 s)" in text
    assert "Mismatched collectives" not in text
    assert long_lines(text) == []


def test_no_findings_and_missing_ranks():
    st = seed_states(3)
    del st[2]
    text = render_text(incident(st, [], trigger="dump", world_size=3, missing=[2], run_id="r1"))
    assert (
        next(line for line in text.splitlines()[3:] if line.strip())
        == "No hang proven (dump); the state of every rank follows."
    )
    assert "  rank 2: no state received" in text
    assert "Mismatched collectives" not in text


def test_report_dir_is_named_last():
    doc = seed_incident()
    doc["report_dir"] = "/reports/20250101-120000"
    assert render_text(doc).rstrip().splitlines()[-1] == "Report files: /reports/20250101-120000"


def test_process_lines():
    text = render_text(seed_incident())
    assert section(text + "\n", "Processes:") == [
        "  rank 0: pid 1000 on node0, 1 collective events, idle 3.0 s",
        "  rank 1: pid 1001 on node0, 1 collective events, idle 3.0 s",
    ]


@pytest.mark.parametrize("world_size", [2, 64])
def test_render_json_round_trips(world_size, tmp_path):
    doc = seed_incident(world_size)
    text = render_json(doc)
    assert text.endswith("\n")
    assert json.loads(text) == doc
    (tmp_path / "report.json").write_text(text, encoding="utf-8")
    assert documents.load_document(str(tmp_path / "report.json")) == doc  # as `ddpwatch report` reads it


def test_render_json_never_fails_on_odd_values():
    doc = seed_incident()
    doc["extra"] = {1, 2}  # not JSON-native: written as its repr
    assert json.loads(render_json(doc))["extra"] == repr({1, 2})


# ---------------------------------------------------------------- golden file

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "seed_report.txt")


def golden_seed_incident():
    """The seed stall, built by hand down to the finding's words, so only rendering changes can move the text."""
    st = seed_states(2)
    for state in st.values():
        state["recent"] = [
            done(9, "all_reduce", site=("train.py", 84, "train"), api=build.DDP_GRAD_ALLREDUCE),
            done(10, "barrier", site=("train.py", 88, "train")),
        ]
        state["last_seq"] = {"0": 11}
        state["ddp_steps"] = 4
        state["process"] = {"status": "sleeping", "cpu_percent": 0.5, "rss_mb": 317.2, "threads": 8}
    st[0]["progress_bars"] = [{"desc": "validation", "n": 0, "total": 3, "since_update_s": 3.1}]
    st[0]["stacks"] = [wrapped_stack()]  # ddpwatch's own frames, as real stacks have them: folded in the text
    st[1]["stacks"][0]["frames"].insert(2, frame(("<ddpwatch hot path: barrier>", 32, "barrier"), internal=True))
    mismatched = [
        {
            "ranks": [0],
            "group": "0",
            "seq": 11,
            "op": "broadcast",
            "api": "_broadcast_coalesced",
            "shapes": [[8]],
            "dtypes": ["float32"],
            "site": st[0]["inflight"][0]["site"],
            "region": st[0]["inflight"][0]["region"],
            "wait_s": 3.0,
            "description": "broadcast of module buffers inside DistributedDataParallel.forward called at val.py:42",
        },
        {
            "ranks": [1],
            "group": "0",
            "seq": 11,
            "op": "barrier",
            "api": "barrier",
            "shapes": [],
            "dtypes": [],
            "site": st[1]["inflight"][0]["site"],
            "region": None,
            "wait_s": 3.0,
            "description": "barrier at train.py:88",
        },
    ]
    finding = {
        "kind": "ddp_forward_on_subset",
        "ranks": [0],
        "summary": "Rank 0 called the DistributedDataParallel model at val.py:42 (/u/val.py:42 in validate()) while "
        "rank 1 did not: DDP's forward broadcasts the module's buffers (such as BatchNorm running "
        "statistics) from rank 0 to every rank before computing, so every rank must run it. Rank 0 blocks "
        "in broadcast of module buffers inside DistributedDataParallel.forward called at val.py:42; rank 1 "
        "waits in barrier at train.py:88. Neither side can ever finish.",
        "fix": "For rank-local work (evaluation, logging) call the wrapped module directly: `model.module(x)` instead "
        "of `model(x)` at val.py:42; or run that forward on every rank.",
        "location": {"file": "/u/val.py", "line": 42, "function": "validate"},
        "evidence": {"ddp_op": "buffer_broadcast", "mismatched": mismatched},
    }
    doc = incident(st, [finding], run_id="20250101-120000-job7")
    doc["report_dir"] = "/reports/20250101-120000-job7"
    return doc


def test_seed_report_matches_the_golden_file():
    actual = render_text(golden_seed_incident())
    with open(GOLDEN, encoding="utf-8") as handle:
        expected = handle.read()
    if actual != expected:
        with open(GOLDEN + ".actual", "w", encoding="utf-8") as handle:
            handle.write(actual)
        pytest.fail(
            f"report.txt differs from {GOLDEN}; the output is in {GOLDEN}.actual: review it, and if it is "
            "right, move it over the golden file"
        )
    assert long_lines(actual) == []


def test_a_wait_under_a_second_is_shown_in_tenths_not_as_zero():
    from ddpwatch.render import seconds_text

    assert [seconds_text(s) for s in (0.42, 0.6, 0.96, 3.0, 301.2)] == ["0.4 s", "0.6 s", "1 s", "3 s", "301 s"]
