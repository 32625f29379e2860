"""The corpus of real reported hangs (benchmarks/corpus): its expectations are well formed and its scoring is right."""

import os
import re

import pytest

from benchmarks.corpus import score

PATHS = score.case_paths()
EXPECTS = {score.case_name(path): score.load_expect(path) for path in PATHS}
SCORED = {name: expect for name, expect in EXPECTS.items() if score.is_scored(expect)}
# A thread (an issue, a pull request, a forum topic) or, for the correct programs, the public code or documentation
# page whose pattern a case distils: a file of a repository at a commit or branch, a tutorial, a docs page.
SOURCE = re.compile(
    r"^https://(github\.com/[\w.-]+/[\w.-]+/((issues|pull)/\d+|blob/[\w.-]+/\S+)|discuss\.pytorch\.org/t/\S+"
    r"|(docs\.)?pytorch\.org/\S+|lightning\.ai/docs/\S+|huggingface\.co/docs/\S+)$"
)


@pytest.mark.parametrize("path", PATHS, ids=[score.case_name(p) for p in PATHS])
def test_every_case_has_a_valid_expectation(path):
    expect = EXPECTS[score.case_name(path)]
    assert set(expect) - score.OPTIONAL_KEYS == score.EXPECT_KEYS, sorted(expect)
    assert SOURCE.match(expect["source"]), expect["source"]
    assert expect["family"] in score.FAMILIES and expect["summary"].strip()
    assert isinstance(expect["world_size"], int) and 2 <= expect["world_size"] <= 4
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    assert text.startswith('"""') and text.split("\n", 1)[0].endswith('"""'), "a one-line module docstring first"
    if expect["kind"] is None:  # benign, or a thread whose hang cannot form on gloo: nothing to name
        assert expect["ranks"] is None and expect["line"] is None and expect["fix"] == []
        assert "DDPWATCH-MARK" not in text or expect.get("gloo_note")
        assert expect["family"] == "benign" or expect.get("gloo_note"), "a hang case needs a kind"
        return
    assert not expect.get("gloo_note")
    assert expect["kind"] in score.KINDS
    assert expect["ranks"] and all(0 <= r < expect["world_size"] for r in expect["ranks"])
    assert expect["line"] in score.tag_lines(path), f"no '# LINE:{expect['line']}' in the file"
    assert expect["fix"] and all(word == word.lower() for word in expect["fix"])
    assert "DDPWATCH-MARK hang-forms" in text, "the hang cases print the mark the latency is measured from"


def test_the_corpus_meets_the_issue_minimums():
    families = [expect["family"] for expect in SCORED.values()]
    assert len(SCORED) >= 25
    assert families.count("p2p") >= 5
    assert families.count("decision") + families.count("exception") >= 5
    assert families.count("benign") >= 40  # issue 40: correct programs, each the pattern of public code
    assert len({expect["source"] for expect in SCORED.values()}) >= 25, "one thread per case, mostly"


def test_every_case_file_name_is_unique_by_number():
    numbers = [score.case_name(path).split("_", 1)[0] for path in PATHS]
    assert len(numbers) == len(set(numbers))


# ---------------------------------------------------------------- scoring on hand-built reports

CASE = os.path.join(score.CASES_DIR, "11_decision_resume_rank0_only.py")
BENIGN = os.path.join(score.CASES_DIR, "52_benign_ddp_join_uneven.py")


def report(kind, ranks, line, fix, file=CASE, created_at=100.0):
    return {
        "created_at": created_at,
        "findings": [
            {
                "kind": kind,
                "ranks": ranks,
                "summary": "...",
                "fix": fix,
                "location": {"file": file, "line": line, "function": "main"},
            }
        ],
    }


def test_a_hit_scores_every_check_and_the_latency():
    expect = score.load_expect(CASE)
    line = score.tag_lines(CASE)[expect["line"]]
    got = report("local_decision", [0], line, "All_reduce the stop decision so every rank leaves together.")
    row = score.score(expect, CASE, got, [3, 3], mark=99.25)
    assert (row["kind"], row["ranks"], row["line"], row["fix"]) == (True, True, True, True)
    assert row["false_alarm"] is None and row["latency"] == 0.75
    assert score.misses([row]) == []


def test_a_miss_says_what_ddpwatch_said_instead():
    expect = score.load_expect(CASE)
    got = report(
        "uneven_inputs", [1], 60, "Give every rank the same number of batches: " + "x" * 200, file="/elsewhere/train.py"
    )
    row = score.score(expect, CASE, got, [3, 3], mark=None)
    assert (row["kind"], row["ranks"], row["line"], row["fix"]) == (False, False, False, False)
    assert row["latency"] is None
    [line] = score.misses([row])
    assert "uneven_inputs ranks [1] at train.py:60" in line and len(line) < 220


def test_no_report_on_a_hang_case_is_a_miss_on_every_check():
    row = score.score(score.load_expect(CASE), CASE, None, [-9, -9], mark=5.0)
    assert (row["kind"], row["ranks"], row["line"], row["fix"]) == (False, False, False, False)
    assert score.misses([row]) == [f"{score.case_name(CASE)}: no report (exit codes [-9, -9])"]


def test_a_benign_case_with_a_report_or_a_failed_rank_is_a_false_alarm():
    expect = score.load_expect(BENIGN)
    clean = score.score(expect, BENIGN, None, [0, 0], mark=None)
    assert clean["false_alarm"] is False and clean["kind"] is True and clean["line"] is None
    alarm = score.score(expect, BENIGN, report("straggler", [0], 30, "raise the timeout", file=BENIGN), [3, 3], None)
    assert alarm["false_alarm"] is True and alarm["kind"] is False
    assert score.score(expect, BENIGN, None, [0, 1], mark=None)["false_alarm"] is True
    # printed other results armed than plain (ddpwatch changed what the program computed): a false alarm too
    assert score.score(expect, BENIGN, None, [0, 0], mark=None, output_differs=True)["false_alarm"] is True


def test_the_last_mark_is_the_latest_rank_s_last_one():
    stderr = [
        "DDPWATCH-MARK hang-forms 10.500\nother\nDDPWATCH-MARK hang-forms 12.000\n",
        "noise\nDDPWATCH-MARK hang-forms 11.250\n",
        "",
    ]
    assert score.last_mark(stderr) == 12.0
    assert score.last_mark(["nothing here", None]) is None


def test_the_table_prints_every_case_and_the_totals():
    expect = score.load_expect(CASE)
    line = score.tag_lines(CASE)[expect["line"]]
    hit = score.score(expect, CASE, report("local_decision", [0], line, "broadcast it"), [3, 3], 99.0)
    benign = score.score(score.load_expect(BENIGN), BENIGN, None, [0, 0], None)
    text = score.table([hit, benign])
    assert score.case_name(CASE) in text and score.case_name(BENIGN) in text
    assert "decision+exception (1 cases): kind 1/1, ranks 1/1, line 1/1, fix 1/1" in text
    assert "benign (1 cases): kind 1/1, false alarms 0/1" in text


# ---------------------------------------------------------------- one real run (processes, up to 60 s)


@pytest.mark.real
@pytest.mark.timeout(120)
def test_real_one_benign_case_runs_clean_through_the_runner():
    """REAL: 2 gloo ranks under DDPWATCH=1 run the DDP join() case; no report, exit 0 (run_ranks kills at 60 s)."""
    from benchmarks.corpus.__main__ import run_case, run_plain

    plain, codes = run_plain(BENIGN, limit=60)
    assert codes == [0, 0], (codes, plain)
    row = run_case(BENIGN, limit=60, recorder="python", plain=plain, timeout=5.0)
    assert row["exit_codes"] == [0, 0], row
    assert row["said"] is None and row["false_alarm"] is False and row["output_differs"] is False
