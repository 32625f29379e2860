"""Every command README.md and docs/ show is run by a test: the demo and the commands that read its output here, on
that output; every other command by the test this table names for it. A new command with no runner fails here."""

import glob
import os
import re
import shlex
import sys

import pytest

from ranks import ROOT
from test_docs import DOCS, blocks, run_shell, tagged, user_env

# (a pattern over one command, where it is run: "here", or the test that runs it). A command is one line of a
# bash/sh block, or a `$ ` line of a console block, split at `&&`.
RUNNERS = (
    (r"pip install ", "by hand on a fresh clone (the network); the rest of its line is in this table"),
    (r"python -m pytest -q -n 3 --dist loadgroup$", "the test suite itself"),
    (r"python -m pytest -q -m \"not real\"$", "the test suite itself (its fast tier)"),
    (r"python -m ddpwatch demo --dir ddpwatch-reports$", "here"),
    (r"latest=\$\(ls -td \./ddpwatch-reports/\*/ \| head -1\)$", "here"),
    (r'ddpwatch report "\$latest" --format ', "here"),
    (r"ddpwatch lint train\.py$", "here"),
    (
        r"DDPWATCH=1 torchrun --standalone --nproc-per-node 2 train\.py$",
        "test_docs.py::test_readme_zero_code_command_catches_an_unmodified_script_and_report_rerenders_it",
    ),
    (
        r"DDPWATCH=1 (DDPWATCH_ACTION=abort )?torchrun --nproc-per-node 2 train\.py$",
        "test_activation.py::test_torchrun_with_DDPWATCH_catches_the_unmodified_seed_and_aborts",
    ),
    (
        r"ddpwatch run -- (torchrun|python -m torch\.distributed\.run) --nproc-per-node 2 train\.py$",
        "test_activation.py::test_ddpwatch_run_guards_torchrun_workers",
    ),
    (
        r"export DDPWATCH_ON_INCIDENT=",
        "test_real_restarts.py::test_a_job_that_hangs_in_its_first_attempt_only_is_aborted_restarted_and_finishes_with_one_report",
    ),
    (
        r"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 DDPWATCH=1 DDPWATCH_ACTION=abort torchrun --standalone "
        r"--nproc-per-node 2 --max-restarts \d+ train\.py$",
        "test_real_restarts.py::test_a_job_that_hangs_in_its_first_attempt_only_is_aborted_restarted_and_finishes_with_one_report",
    ),
    (
        r"python -m benchmarks\.whole_job ",
        "test_benchmarks.py::test_whole_job_quick_mode_runs_every_job_and_level_and_its_attribution_adds_up",
    ),
    (r"python -m benchmarks", "test_benchmarks.py::test_quick_mode_runs_and_prints_its_table"),
    (
        r"python -m pytest -q tests/test_benchmarks\.py$",
        "test_benchmarks.py::test_quick_mode_runs_and_prints_its_table",
    ),
    (r"ddpwatch dump\b", "test_activation.py::test_dump_a_live_job_then_sigterm_ends_each_rank_as_torch_would"),
    (r"kill -USR1 ", "test_activation.py::test_first_init_installs_and_arms_and_sigusr1_dumps"),
)


def commands():
    """[(file, command)] of every command shown in README.md and docs/."""
    found = []
    for path in DOCS:
        for _, language, code in blocks(path):
            if language in ("bash", "sh"):
                lines = [line.split(" #")[0].strip() for line in code.splitlines()]
            elif language == "console":
                lines = [line[2:].strip() for line in code.splitlines() if line.startswith("$ ")]
            else:
                continue
            for line in lines:
                if line and not line.startswith("#"):
                    found += [(os.path.basename(path), part.strip()) for part in line.split("&&")]
    return found


def runner(command):
    return next((where for pattern, where in RUNNERS if re.match(pattern, command)), None)


def test_every_command_in_the_docs_has_a_runner_and_every_named_test_exists():
    orphans = [(path, command) for path, command in commands() if runner(command) is None]
    assert orphans == [], "a command in the docs that no test runs: add it to RUNNERS, with its test"
    for _, where in RUNNERS:
        if "::" in where:
            module, name = where.split("::")
            assert f"def {name}(" in open(os.path.join(ROOT, "tests", module), encoding="utf-8").read(), where


def test_the_commands_run_here_are_the_ones_readme_and_lint_md_show():
    shown = {command for _, command in commands()}
    assert "python -m ddpwatch demo --dir ddpwatch-reports" in shown
    assert "ddpwatch lint train.py" in shown
    assert [line for line in tagged("report").splitlines() if line.strip()] == [
        c for _, c in commands() if c.startswith(("latest=$(ls -td ./ddpwatch-reports/", 'ddpwatch report "$latest"'))
    ][:3]


def without_numpy(tmp_path):
    """A folder that makes `import numpy` fail, first on PYTHONPATH: a fresh venv has no numpy (not a dependency)."""
    shim = tmp_path / "no-numpy" / "numpy"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy'\")\n")
    return str(shim.parent)


@pytest.mark.real
@pytest.mark.timeout(240)
def test_readme_demo_prints_no_noise_and_every_command_runs_on_its_output(tmp_path):
    env = user_env(tmp_path)
    env["PYTHONPATH"] = without_numpy(tmp_path) + os.pathsep + env["PYTHONPATH"]
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    [demo] = [c for _, c in commands() if c.startswith("python -m ddpwatch demo")]
    code, out, err = run_shell(demo.replace("python", shlex.quote(sys.executable), 1), tmp_path, env, timeout=180)
    assert code == 0 and "stall caught" in err, err[-3000:]
    # Nothing a newcomer takes for an error: no warning, no traceback, no bar frozen at 0%, one line for the abort.
    assert "Warning" not in err and "Traceback" not in err and "NumPy" not in err, err[:3000]
    assert "validation:" not in err and err.count("ending every rank with exit code 3") == 1, err[-3000:]
    assert len(glob.glob(str(tmp_path / "ddpwatch-reports" / "*" / "report.json"))) == 1
    block = tagged("report")  # one shell: its first line names the folder the others read
    code, out, err = run_shell("set -e\n" + block, tmp_path, env, timeout=120)
    assert code == 0, (block, err)
    assert "[ddp_forward_on_subset] culprit: rank 0 at seed_stall.py:" in out
    assert (tmp_path / "incident.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.real
def test_lint_on_the_demo_script_without_its_noqa_prints_what_lint_md_shows(tmp_path):
    source = open(os.path.join(ROOT, "ddpwatch", "examples", "seed_stall.py"), encoding="utf-8").read()
    stripped = re.sub(r"  # noqa: DDP001[^#\n]*", "", source)
    assert stripped != source
    (tmp_path / "train.py").write_text(stripped)
    [(_, _, block)] = [b for b in blocks(os.path.join(ROOT, "docs", "lint.md")) if b[0] == "lint-demo"]
    command, *expected = block.splitlines()
    code, out, err = run_shell(command[2:], tmp_path, user_env(tmp_path), timeout=60)
    assert code == 1 and out.splitlines() == expected, out + err
