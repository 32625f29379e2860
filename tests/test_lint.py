"""Tests for `ddpwatch lint` and the rank-condition recogniser (ddpwatch.static.rankcond) it shares with the report."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpwatch import lint
from ddpwatch.static import rankcond
from ddpwatch.lint import lint_file, lint_source, main
from ddpwatch.static.rankcond import is_rank_condition, rank_condition_at, rank_condition_at_path

FIXTURES = Path(__file__).parent / "lint_fixtures"
REPO = Path(__file__).resolve().parents[1]
CORPUS = sorted(FIXTURES.glob("corpus_*.py"))
TEXT_LINE = re.compile(r"^(?P<path>.+):(?P<line>\d+):(?P<col>\d+): (?P<code>DDP\d{3}) (?P<message>.+)$")


def expected_findings(path: Path) -> set[tuple[int, str]]:
    """The `# expect: DDP00N` annotations in a fixture, as (line, code)."""
    found = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = re.search(r"# expect: (DDP\d{3})", text)
        if match:
            found.add((number, match.group(1)))
    return found


def findings_in(path: Path) -> set[tuple[int, str]]:
    return {(finding.line, finding.code) for finding in lint_file(str(path))}


def line_of(path: Path, text: str) -> int:
    lines = path.read_text().splitlines()
    matches = [number for number, line in enumerate(lines, start=1) if text in line]
    assert len(matches) == 1, (text, matches)
    return matches[0]


# --- each check on its fixtures ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["DDP001", "DDP002", "DDP003", "DDP004"])
def test_check_fires_on_every_bad_case(code):
    path = FIXTURES / f"{code.lower()}_bad.py"
    expected = expected_findings(path)
    assert expected and {c for _, c in expected} == {code}
    assert findings_in(path) == expected


@pytest.mark.parametrize("code", ["DDP001", "DDP002", "DDP003", "DDP004"])
def test_check_is_quiet_on_the_corrected_code(code):
    assert lint_file(str(FIXTURES / f"{code.lower()}_good.py")) == []


def test_seed_is_flagged_at_the_validation_call():
    path = FIXTURES / "seed_trainer.py"
    (finding,) = lint_file(str(path))
    assert finding.code == "DDP001"
    assert finding.line == line_of(path, "outputs = self.encoder(input)")
    assert "`self.encoder`" in finding.message
    call_site = line_of(path, "self.validation()")
    condition = line_of(path, "if torch.distributed.get_rank() == 0:")
    assert (
        f"validation() is called at line {call_site}, under `if torch.distributed.get_rank() == 0:` (line {condition})"
    ) in finding.message
    assert "self.encoder.module(...)" in finding.hint


def test_fixed_seed_is_clean():
    assert lint_file(str(FIXTURES / "seed_trainer_fixed.py")) == []


def test_corpus_has_the_promised_styles():
    names = {path.stem for path in CORPUS}
    assert len(CORPUS) >= 5
    assert {
        "corpus_plain_ddp",
        "corpus_torchrun",
        "corpus_lightning",
        "corpus_accelerate",
        "corpus_checkpoint",
    } <= names


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_correct_training_scripts_are_clean(path):
    assert lint_file(str(path)) == []


# --- smaller cases -------------------------------------------------------------------------------------------

DDP_HEADER = "import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def codes(source: str) -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in lint_source(DDP_HEADER + source)]


def test_attribute_methods_of_the_wrapper_are_not_model_calls():
    source = (
        "def f(m, x, rank):\n"
        "    m = DDP(m)\n"
        "    if rank == 0:\n"
        "        m.eval(); m.train(); m.state_dict(); m.module(x); m.module.forward(x)\n"
    )
    assert codes(source) == []


def test_wrapper_passed_through_to_a_method_chain_is_still_wrapped():
    source = "def f(m, x, rank):\n    m = DDP(m).to('cuda')\n    net = m\n    if rank == 0:\n        net(x)\n"
    assert codes(source) == [(7, "DDP001")]


def test_functools_reduce_and_torch_gather_are_not_collectives():
    source = (
        "from functools import reduce\nimport torch\n"
        "def f(xs, rank):\n"
        "    if rank == 0:\n"
        "        reduce(lambda a, b: a + b, xs); torch.gather(xs, 0, xs)\n"
    )
    assert codes(source) == []


def test_two_identical_rank_conditions_do_not_pair_up():
    source = "def f(rank):\n    if rank == 0:\n        dist.barrier()\n    if rank == 0:\n        dist.barrier()\n"
    assert codes(source) == [(5, "DDP002"), (7, "DDP002")]


def test_elif_chain_whose_branches_all_reach_the_collective_is_balanced():
    source = (
        "def a(): dist.new_group([1, 2])\n"
        "def b(): dist.new_group([1, 2])\n"
        "def run(rank):\n"
        "    if rank == 0:\n"
        "        a()\n"
        "    elif rank == 1:\n"
        "        b()\n"
        "    else:\n"
        "        dist.new_group([1, 2])\n"
    )
    assert codes(source) == []


def test_different_models_in_the_two_branches_are_not_balanced():
    source = (
        "def f(m1, m2, x, rank):\n"
        "    m1 = DDP(m1)\n"
        "    m2 = DDP(m2)\n"
        "    if rank == 0:\n"
        "        m1(x)\n"
        "    else:\n"
        "        m2(x)\n"
    )
    assert codes(source) == [(7, "DDP001"), (9, "DDP001")]


def test_wrapped_attribute_is_inherited_by_subclasses_in_the_same_file():
    source = (
        "class Base:\n"
        "    def __init__(self, m):\n"
        "        self.net = DDP(m)\n"
        "class Child(Base):\n"
        "    def peek(self, x):\n"
        "        if self.is_master:\n"
        "            return self.net(x)\n"
    )
    assert codes(source) == [(9, "DDP001")]


def test_rank_used_as_a_loop_variable_is_not_the_process_rank():
    source = (
        "def f(t, world_size):\n"
        "    for rank in range(world_size):\n"
        "        if rank == 0:\n"
        "            dist.broadcast(t, src=rank)\n"
    )
    assert codes(source) == []


def test_match_and_except_star_bodies_are_walked():
    source = (
        "async def f(rank, command):\n"
        "    match command:\n"
        "        case 'sync':\n"
        "            if rank == 0:\n"
        "                dist.barrier()\n"
        "    try:\n"
        "        pass\n"
        "    except* ValueError:\n"
        "        if rank == 0:\n"
        "            dist.barrier()\n"
    )
    assert codes(source) == [(7, "DDP002"), (12, "DDP002")]


def test_module_level_script_is_checked():
    source = (
        "import os\nrank = int(os.environ['RANK'])\nmodel = DDP(object())\n"
        "if rank == 0:\n    dist.barrier()\n    model(1)\n"
    )
    assert codes(source) == [(7, "DDP002"), (8, "DDP001")]


def test_noqa_suppresses_on_its_line_only():
    source = (
        "def f(rank):\n"
        "    if rank == 0:\n"
        "        dist.barrier()  # noqa\n"
        "        dist.barrier()  # noqa: DDP002\n"
        "        dist.barrier()  # noqa: E501, DDP002\n"
        "        dist.barrier()  # noqa: DDP001\n"
        "        dist.barrier()\n"
    )
    assert codes(source) == [(8, "DDP002"), (9, "DDP002")]


def test_unparsable_source_raises_and_lint_file_reports_it(tmp_path):
    with pytest.raises(SyntaxError):
        lint_source("def broken(:\n")
    path = tmp_path / "broken.py"
    path.write_text("def broken(:\n")
    (finding,) = lint_file(str(path))
    assert finding.code == lint.PARSE_ERROR and finding.line == 1


# --- the rank-condition recogniser ---------------------------------------------------------------------------

RANK_CONDITIONS = [
    "rank == 0",
    "local_rank != 0",
    "global_rank > 0",
    "dist.get_rank() == 0",
    "torch.distributed.get_rank() == 0",
    "get_rank() == 0",
    "os.environ['RANK'] == '0'",
    "int(os.environ['LOCAL_RANK']) == 0",
    "os.environ.get('RANK') == '0'",
    "is_main_process()",
    "is_master",
    "self.is_master",
    "trainer.is_global_zero",
    "self.trainer.is_global_zero",
    "accelerator.is_main_process",
    "not accelerator.is_local_main_process",
    "args.local_rank in [-1, 0]",
    "args.local_rank not in (-1, 0)",
    "self.rank == 0",
    "rank % 2 == 1",
    "rank == 0 and epoch % 5 == 0",
    "not dist.is_initialized() or dist.get_rank() == 0",
    "hvd.rank() == 0",
    "rank",
    "not rank",
]
NOT_RANK_CONDITIONS = [
    "world_size > 1",
    "dist.is_initialized()",
    "args.local_rank == -1",
    "args.local_rank != -1",
    "rank is None",
    "local_rank >= 0",
    "epoch % 5 == 0",
    "os.environ['WORLD_SIZE'] == '1'",
    "self.training",
    "matrix.ranking == 0",
    "dist.get_world_size() > 1",
]


@pytest.mark.parametrize("text", RANK_CONDITIONS)
def test_recognises_rank_conditions(text):
    assert is_rank_condition(ast.parse(text, mode="eval").body, rankcond.DEFAULT_RANK_NAMES)


@pytest.mark.parametrize("text", NOT_RANK_CONDITIONS)
def test_leaves_uniform_conditions_alone(text):
    assert not is_rank_condition(ast.parse(text, mode="eval").body, rankcond.DEFAULT_RANK_NAMES)


def test_aliases_assigned_from_rank_expressions_count():
    tree = ast.parse("r = dist.get_rank()\nleader = r == 0\nself.is_main = leader\n")
    names = rankcond.collect_rank_names(tree.body)
    assert {"r", "leader", "self.is_main"} <= names
    assert is_rank_condition(ast.parse("leader", mode="eval").body, names)
    assert not is_rank_condition(ast.parse("obj.r", mode="eval").body, names)


CONDITION_SOURCE = """\
import torch.distributed as dist


def step(local_rank):
    r = dist.get_rank()
    everyone = 1
    if r == 0:
        only_zero = 1
    else:
        the_others = 1
    if local_rank != 0:
        return
    after_exit = 1
    step = 0
    while dist.get_rank() > step:
        polling = 1


def helper():
    anywhere = 1
"""


@pytest.mark.parametrize(
    "marker, expected",
    [
        ("only_zero", {"line": 7, "text": "if r == 0:", "kind": "if"}),
        ("the_others", {"line": 7, "text": "if r == 0:", "kind": "else"}),
        ("after_exit", {"line": 11, "text": "if local_rank != 0:", "kind": "early_exit", "exit_line": 12}),
        ("polling", {"line": 15, "text": "while dist.get_rank() > step:", "kind": "while"}),
        ("everyone", None),
        ("anywhere", None),
    ],
)
def test_rank_condition_at(marker, expected):
    line = next(n for n, text in enumerate(CONDITION_SOURCE.splitlines(), 1) if marker in text)
    assert rank_condition_at(CONDITION_SOURCE, line) == expected


@pytest.mark.parametrize(
    "source, line",
    [
        ("def broken(:\n    pass\n", 2),
        (CONDITION_SOURCE, 0),
        (CONDITION_SOURCE, 10_000),
        (None, 3),
        (CONDITION_SOURCE, "8"),
        ("x = '\0'\n", 1),
    ],
)
def test_rank_condition_at_never_raises(source, line):
    assert rank_condition_at(source, line) is None


def test_rank_condition_at_path_reads_caches_and_notices_edits(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(CONDITION_SOURCE)
    assert rank_condition_at_path(str(path), 8)["kind"] == "if"
    path.write_text("x = 1\n" * 8 + "# longer, so the cache key changes\n")
    assert rank_condition_at_path(str(path), 8) is None
    assert rank_condition_at_path(str(tmp_path / "missing.py"), 3) is None
    path.write_text("def broken(:\n")
    assert rank_condition_at_path(str(path), 1) is None
    rankcond.clear_cache()


# --- the command line ----------------------------------------------------------------------------------------


def test_cli_exit_0_when_clean(capsys):
    assert main([str(FIXTURES / "seed_trainer_fixed.py")]) == 0
    assert capsys.readouterr().out == ""


def test_cli_text_format_and_exit_1(capsys):
    path = str(FIXTURES / "seed_trainer.py")
    assert main([path]) == 1
    lines = capsys.readouterr().out.splitlines()
    match = TEXT_LINE.match(lines[0])
    assert match and match["path"] == path and match["code"] == "DDP001"
    assert lines[1].startswith("    hint: ")
    assert main(["--no-hints", path]) == 1
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_cli_json_format(capsys):
    assert main(["--format", "json", str(FIXTURES / "ddp003_bad.py")]) == 1
    records = json.loads(capsys.readouterr().out)
    assert [r["code"] for r in records] == ["DDP003"] * 3
    assert set(records[0]) == {"path", "line", "col", "code", "message", "hint"}
    assert all(r["hint"] for r in records)


def test_cli_parse_error_exits_2_and_still_checks_the_rest(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("def broken(:\n")
    (tmp_path / "bad.py").write_text((FIXTURES / "ddp002_bad.py").read_text())
    assert main([str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "DDP000" in out and "DDP002" in out
    assert main(["--select", "DDP004", str(tmp_path)]) == 2  # a file that did not parse is never clean


@pytest.mark.parametrize(
    "argv", [[], ["--select", "DDP999", "x.py"], ["--format", "xml", "x.py"], ["does/not/exist.py"]]
)
def test_cli_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2


def test_cli_select_ignore_and_default_ignore(capsys):
    path = str(FIXTURES / "ddp002_bad.py")
    assert main(["--select", "DDP001,DDP003", path]) == 0
    assert main(["--ignore", "ddp002", path]) == 0
    assert main([path], default_ignore=("DDP002",)) == 0
    assert main(["--select", "DDP002", path], default_ignore=("DDP002",)) == 1
    capsys.readouterr()


def test_cli_noqa(tmp_path, capsys):
    path = tmp_path / "job.py"
    path.write_text(DDP_HEADER + "def f(rank):\n    if rank == 0:\n        dist.barrier()  # noqa: DDP002\n")
    assert main([str(path)]) == 0


def test_folders_skip_hidden_venvs_and_pycache(tmp_path, capsys):
    bad = (FIXTURES / "ddp002_bad.py").read_text()
    for folder in (".hidden", "venv", "__pycache__", "myenv"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "bad.py").write_text(bad)
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "clean.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text(bad)
    files, missing = lint.iter_python_files([str(tmp_path)])
    assert files == [str(tmp_path / "pkg" / "clean.py")] and missing == []
    assert main([str(tmp_path)]) == 0


@pytest.mark.real
def test_python_dash_m_runs_the_linter():
    result = subprocess.run(
        [sys.executable, "-m", "ddpwatch.lint", "--no-hints", "tests/lint_fixtures/seed_trainer.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 1, result.stderr
    assert TEXT_LINE.match(result.stdout.splitlines()[0])


def test_lint_and_rankcond_do_not_import_torch():
    for module in (lint, rankcond):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any(name.split(".")[0] == "torch" for name in imported)
