"""The docs cannot rot: README's commands and code run here, and the docs' code blocks match the code they show."""

import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from ranks import ROOT, SCENARIOS, reports

DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def blocks(path, language=None):
    """[(tag or None, language, text)] for each fenced block; tag from a `<!-- docs-test: NAME -->` line above it."""
    text = open(path, encoding="utf-8").read()
    found = []
    for match in re.finditer(r"(?:<!-- docs-test: ([\w-]+) -->\n)?```(\w*)\n(.*?)```", text, re.S):
        if language is None or match.group(2) == language:
            found.append((match.group(1), match.group(2), match.group(3)))
    return found


def tagged(tag):
    [block] = [b for b in blocks(DOCS[0]) if b[0] == tag]
    return block[2]


def run_shell(line, cwd, env, timeout=120):
    """One README command line through bash, in its own process group, killed whole at the limit."""
    proc = subprocess.Popen(
        ["bash", "-c", line],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out, err


def user_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPWATCH")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT
    return env


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_every_python_block_in_the_docs_compiles(path):
    for _, _, code in blocks(path, "python"):
        compile(textwrap.dedent(code), path, "exec")  # a method shown alone is indented


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_every_ddpwatch_command_in_the_docs_parses(path):
    from ddpwatch.cli import build_parser

    parser = build_parser()
    for _, language, code in blocks(path):
        if language not in ("bash", "sh"):
            continue
        for line in code.splitlines():
            words = shlex.split(line.split("#")[0]) if line.strip() and not line.lstrip().startswith("#") else []
            while words and "=" in words[0]:
                words = words[1:]  # VAR=value prefixes
            if words[:3] == ["python", "-m", "ddpwatch"]:
                words = ["ddpwatch"] + words[3:]
            if words[:1] != ["ddpwatch"] or len(words) < 2 or words[1] in ("lint", "run"):
                continue  # lint and run take the rest of the line as their own arguments
            try:
                parser.parse_args(words[1:])
            except SystemExit as exc:
                assert exc.code == 0, f"{os.path.basename(path)}: `{line.strip()}` does not parse"


def test_hang_catalogue_shows_the_current_reproductions():
    sys.path.insert(0, os.path.join(ROOT, "docs", "tools"))
    import gen_hangs

    text = open(os.path.join(ROOT, "docs", "hangs.md"), encoding="utf-8").read()
    for kind, _, _, (path, function), _, _, _, _ in gen_hangs.SECTIONS + gen_hangs.FRAMEWORK_SECTIONS:
        source = gen_hangs.function_source(path, function)
        assert source and f"```python\n{source}\n```" in text, f"docs/hangs.md shows an old {function}()"
        assert f"[{kind}] culprit:" in text


def test_the_interface_lists_exactly_the_finding_kinds_of_the_table():
    from ddpwatch import analysis

    text = open(os.path.join(ROOT, "docs", "interface.md"), encoding="utf-8").read()
    listed = re.search(r"Finding kinds, exactly these strings: (.*?)\. ", text, re.S).group(1)
    assert sorted(re.findall(r"`(\w+)`", listed)) == sorted(analysis.FINDING_KINDS)


@pytest.mark.real
@pytest.mark.timeout(200)
def test_readme_zero_code_command_catches_an_unmodified_script_and_report_rerenders_it(tmp_path):
    shutil.copy(os.path.join(SCENARIOS, "plain_seed.py"), tmp_path / "train.py")
    env = dict(user_env(tmp_path), DDPWATCH_ACTION="abort")
    [line] = [text for text in tagged("zero-code").splitlines() if text.strip()]
    code, out, err = run_shell(line, tmp_path, env)
    assert code != 0 and reports(tmp_path / "ddpwatch-reports"), err[-3000:]
    assert "[ddp_forward_on_subset] culprit: rank 0" in err
    block = tagged("report")  # one shell: its first line names the folder the others read
    code, out, err = run_shell("set -e\n" + block, tmp_path, user_env(tmp_path), timeout=120)
    assert code == 0, (block, err)
    assert "[ddp_forward_on_subset] culprit: rank 0 at train.py:" in out
    assert (tmp_path / "incident.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.real
@pytest.mark.timeout(200)
def test_readme_guard_example_runs_clean(tmp_path):
    (tmp_path / "train.py").write_text(tagged("guard"))
    code, out, err = run_shell(
        f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nproc-per-node 2 train.py",
        tmp_path,
        user_env(tmp_path),
    )
    assert code == 0, err[-3000:]
    assert not (tmp_path / "ddpwatch-reports").exists()


def test_every_lint_example_flags_exactly_the_lines_its_comments_name(tmp_path, capsys):
    """docs/lint.md marks each line a check should flag with `# DDP00N`: lint each example and compare."""
    from ddpwatch import lint

    examples = [
        code
        for _, _, code in blocks(os.path.join(ROOT, "docs", "lint.md"), "python")
        if re.search(r"#\s*DDP\d{3}", code)
    ]
    assert len(examples) >= 4
    for index, code in enumerate(examples):
        source = textwrap.dedent(code)
        path = tmp_path / f"example_{index}.py"
        path.write_text(source)
        expected = sorted(
            (n, code) for n, line in enumerate(source.splitlines(), 1) for code in re.findall(r"#\s*(DDP\d{3})", line)
        )
        capsys.readouterr()
        lint.main([str(path), "--format", "json"])
        found = sorted((item["line"], item["code"]) for item in json.loads(capsys.readouterr().out))
        assert found == expected, f"docs/lint.md example {index}:\n{source}"
