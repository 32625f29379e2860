"""The command line in subprocesses: the README's demo commands and `ddpwatch report`."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

from ranks import ROOT, reports

pytestmark = pytest.mark.timeout(200)


def _run(args, tmp_path, timeout=180):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DDPWATCH", None)
    return subprocess.run(
        [sys.executable, "-m", "ddpwatch"] + args,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(tmp_path),
        start_new_session=True,
    )


@pytest.mark.real
def test_demo_catches_the_seed_stall_and_report_rerenders_it(tmp_path):
    out = tmp_path / "reports"
    done = _run(["demo", "--dir", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stall caught" in done.stderr and "[ddp_forward_on_subset] culprit: rank 0" in done.stderr
    assert "DDPWATCH-MARK" not in done.stdout + done.stderr  # the tests' timing mark is not the user's to see
    [report_json] = reports(out)
    folder = os.path.dirname(report_json)
    # README.md shows this verdict as a real excerpt: it must still be what the demo prints (paths relative to the
    # checkout, wrapping aside, since the absolute path changes where lines break).
    verdict = done.stderr[done.stderr.index("[ddp_forward_on_subset]") :].split("\n\n")[0]
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    shown = readme.split("<!-- docs-test: demo-excerpt -->\n```\n")[1].split("```")[0]
    assert " ".join(shown.split()) == " ".join(verdict.replace(ROOT + os.sep, "").split())
    text = _run(["report", folder], tmp_path)
    assert text.returncode == 0 and "[ddp_forward_on_subset] culprit: rank 0 at seed_stall.py:" in text.stdout
    again = _run(["report", folder, "--format", "json", "--reanalyze"], tmp_path)
    assert again.returncode == 0 and '"kind": "ddp_forward_on_subset"' in again.stdout


@pytest.mark.real
def test_demo_fixed_finishes_cleanly_without_report(tmp_path):
    out = tmp_path / "reports"
    done = _run(["demo", "--fixed", "--dir", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished cleanly with no report" in done.stderr
    assert "DDPWATCH-MARK" not in done.stdout + done.stderr
    assert reports(out) == []


@pytest.mark.real
def test_report_on_a_missing_or_foreign_folder_is_a_clear_error(tmp_path):
    missing = _run(["report", str(tmp_path / "nope")], tmp_path, timeout=60)
    assert missing.returncode == 2 and "ddpwatch report:" in missing.stderr
    (tmp_path / "report.json").write_text('{"format_version": 99}')
    foreign = _run(["report", str(tmp_path)], tmp_path, timeout=60)
    assert foreign.returncode == 2 and "format_version 99" in foreign.stderr


@pytest.mark.real
def test_version_prints_the_package_version():
    import ddpwatch

    done = subprocess.run(
        [sys.executable, "-m", "ddpwatch", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=ROOT),
        cwd=ROOT,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"ddpwatch {ddpwatch.__version__}\n", "")


# ----- `ddpwatch demo` takes its report directory like every command: defaults < files < env < --dir -----


@pytest.fixture
def demo_dir_used(monkeypatch, tmp_path):
    """Run `ddpwatch demo --fixed` in-process with the ranks replaced: returns the DDPWATCH_DIR they would get."""
    from ddpwatch import cli, demo
    from ddpwatch.launch import RankResult

    for name in [k for k in os.environ if k.startswith("DDPWATCH")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = []

    def fake_ranks(command, nprocs, env=None, **kwargs):
        seen.append(env["DDPWATCH_DIR"])
        return [RankResult(rank, 0, "", "") for rank in range(nprocs)]

    monkeypatch.setattr(demo, "run_ranks", fake_ranks)

    def run(*extra):
        assert cli.main(["demo", "--fixed"] + list(extra)) == 0
        return seen[-1]

    return run


def test_demo_without_any_setting_uses_a_folder_under_the_temp_dir(demo_dir_used):
    assert demo_dir_used() == os.path.join(tempfile.gettempdir(), f"ddpwatch-{os.getuid()}", "demo")


def test_demo_honours_ddpwatch_dir(demo_dir_used, monkeypatch, tmp_path):
    monkeypatch.setenv("DDPWATCH_DIR", "from-env")
    assert demo_dir_used() == str(tmp_path / "from-env")


def test_demo_honours_the_dir_of_setup_cfg_below_the_environment_and_dir(demo_dir_used, monkeypatch, tmp_path):
    (tmp_path / "setup.cfg").write_text("[ddpwatch]\ndir = from-file\n")
    assert demo_dir_used() == str(tmp_path / "from-file")
    monkeypatch.setenv("DDPWATCH_DIR", str(tmp_path / "from-env"))
    assert demo_dir_used() == str(tmp_path / "from-env")
    assert demo_dir_used("--dir", "from-arg") == str(tmp_path / "from-arg")


def test_demo_with_a_bad_setting_stops_with_status_2(monkeypatch, tmp_path, capsys):
    from ddpwatch import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPWATCH_DIR", "/dev/null")
    assert cli.main(["demo", "--fixed"]) == 2
    assert "bad value '/dev/null' for dir" in capsys.readouterr().err


def _parsers():
    """Every argparse parser of the command line: the top one, each subcommand's, and lint's own."""
    import argparse

    from ddpwatch import cli
    from ddpwatch.static import lint as lint_cli

    top = cli.build_parser()
    found = [("ddpwatch", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += [(f"ddpwatch {name}", parser) for name, parser in action.choices.items()]
    return found + [("ddpwatch lint", lint_cli._parser())]


def test_every_option_of_every_command_has_help():
    missing = [
        (name, action.option_strings or action.dest)
        for name, parser in _parsers()
        for action in parser._actions
        if not (action.help or "").strip() and action.dest != "command"
    ]
    assert missing == []


@pytest.mark.real
@pytest.mark.timeout(300)
def test_two_runs_incident_folders_given_together_are_refused_naming_both_runs(tmp_path):
    """Issue 43: `ddpwatch report ./ddpwatch-reports/*/` after two incidents merged rank 0 of one job with rank 1 of
    another, exit 0. Every rank file now carries its run; two runs are one line and exit 2, naming both."""
    out = tmp_path / "reports"
    for _ in range(2):
        assert _run(["demo", "--dir", str(out)], tmp_path).returncode == 0
    folders = sorted(os.path.dirname(path) for path in reports(out))
    assert len(folders) == 2
    runs = set()
    for folder in folders:
        with open(os.path.join(folder, "rank-0.json"), encoding="utf-8") as handle:
            runs.add(json.load(handle)["run"])
    assert len(runs) == 2, runs
    refused = _run(["report", *folders, "--format", "text"], tmp_path)
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert all(run in refused.stderr for run in runs) and refused.stderr.count("\n") == 1, refused.stderr
    assert _run(["report", folders[0], "--format", "text"], tmp_path).returncode == 0
