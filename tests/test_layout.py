"""The package's shape: imports point one way (no cycle, function-level imports included), one catalogue, one table
of output formats."""

import ast
import dataclasses
import os
import re

from ddpwatch import catalogue, lint
from ddpwatch.runtime import patch
from ddpwatch.render import report

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ddpwatch")


def _modules() -> dict:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = "ddpwatch." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module[:-len(".__init__")] if module.endswith(".__init__") else module] = path
    return found


def _imports(module: str, path: str, modules: dict) -> set:
    """Every ddpwatch module `module` imports, at its top or inside a function."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddpwatch"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules and name != module and name != "ddpwatch"}


def _cycle(graph: dict):
    state: dict = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_import_graph_of_ddpwatch_has_no_cycle():
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    assert "ddpwatch.sources.merge" in graph["ddpwatch.sources.command"]  # the reader sees function-level and package imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_a_cycle_is_found_when_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_patching_lint_and_the_flight_recorder_read_one_catalogue():
    tensor = catalogue.tensor_collectives()
    assert set(patch.COLLECTIVES) == set(tensor)
    assert set(tensor) <= set(lint.COLLECTIVES)  # every patched collective is also linted
    assert {"all_gather_single", "reduce_scatter_single", "new_group"} <= set(lint.COLLECTIVES)
    assert "send_object_list" not in lint.COLLECTIVES  # point-to-point under a rank condition is normal
    assert catalogue.canonical_op("allreduce") == "all_reduce" == catalogue.canonical_op("all_reduce_coalesced")


def test_every_output_format_is_one_row_and_the_command_offers_exactly_those():
    from ddpwatch import cli

    assert report.FORMATS == tuple(report.RENDERERS) == cli.report_formats()
    names = [row[0] for row in report.RENDERERS.values()]
    assert len(set(names)) == len(names)


# The pipeline's stages as packages, and what each may import besides the shared top-level modules (snapshot,
# shapes, catalogue, config, private): runtime -> analysis -> render, and sources -> analysis, render.
MAY_IMPORT = {
    "ddpwatch.runtime": {"ddpwatch.analysis", "ddpwatch.render"},
    "ddpwatch.sources": {"ddpwatch.analysis", "ddpwatch.render"},
    "ddpwatch.analysis": set(),
    "ddpwatch.render": {"ddpwatch.analysis"},
}
OFFLINE = ("ddpwatch.analysis", "ddpwatch.render", "ddpwatch.sources", "ddpwatch.snapshot", "ddpwatch.shapes",
           "ddpwatch.catalogue")


def _stage(module: str):
    return next((stage for stage in MAY_IMPORT if module == stage or module.startswith(stage + ".")), None)


def test_each_stage_imports_only_the_stages_after_it():
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        stage = _stage(module)
        if stage is None:
            continue
        for imported in _imports(module, path, modules):
            other = _stage(imported)
            if other is not None and other != stage and other not in MAY_IMPORT[stage]:
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_the_offline_stages_never_import_torch():
    """A saved incident is analysed and rendered anywhere: these modules must not import torch, even lazily."""
    torch_imports = []
    for module, path in _modules().items():
        if not module.startswith(OFFLINE):
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            torch_imports += [f"{module}: {n}" for n in names if n == "torch" or n.startswith("torch.")]
    assert torch_imports == []


def test_option_defaults_are_written_once_in_the_options_table():
    """grace/timeout were retyped in five places: a parameter named as an option, with that option's default as a
    literal, is a copy of the default (launch's own `timeout=120.0` is another thing, and allowed)."""
    from ddpwatch import config

    literal_defaults = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.args + node.args.kwonlyargs
                defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults \
                    + node.args.kw_defaults
                literal_defaults += [f"{module}.{node.name}({arg.arg}=...)" for arg, default in zip(args, defaults)
                                     if arg.arg in config.DEFAULTS and isinstance(default, ast.Constant)
                                     and default.value == config.DEFAULTS[arg.arg]]
    assert literal_defaults == []
    assert {f.name: f.default for f in dataclasses.fields(config.Config) if f.name in config.DEFAULTS} == \
        config.DEFAULTS


# ---------------------------------------------------------------- the analysis hands over facts; render words them

# The words of a report live in ddpwatch/render/wording.py (issue 20): no analysis module defines these.
WORDING_NAMES = ("describe_op", "rank_list", "FRAMEWORK_FIXES", "framework_fix", "SENTENCES")
_NAME_LIST = re.compile(r"\w+(, \w+)*")  # a Stage's `takes` ("live, blocked, timeout") names arguments: no prose


def _defined_names(tree: ast.AST) -> set:
    defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return defined | {target.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                      for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                      if isinstance(target, ast.Name)}


def _sentences(tree: ast.AST) -> list:
    """(line, text) of each string of three words or more, f-string pieces included; docstrings and the
    messages of raised errors are not what a report says."""
    skip, texts = set(), []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            skip.add(id(first.value))
        if isinstance(node, ast.Raise):
            skip.update(id(sub) for sub in ast.walk(node))
        if isinstance(node, ast.JoinedStr) and id(node) not in skip:  # an f-string: each {value} counts as a word
            skip.update(id(part) for part in node.values)
            texts.append((node.lineno, "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in node.values)))
    texts += [(node.lineno, node.value) for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip]
    return sorted((line, text) for line, text in texts
                  if len(text.split()) >= 3 and not _NAME_LIST.fullmatch(text.strip()))


def _wording_in(module: str, path: str, modules: dict) -> list:
    tree = ast.parse(open(path, encoding="utf-8").read())
    return ([f"{module} defines {name}" for name in sorted(_defined_names(tree)) if name in WORDING_NAMES]
            + [f"{module}:{line} builds words: {text!r}" for line, text in _sentences(tree)]
            + [f"{module} imports {name}" for name in sorted(_imports(module, path, modules))
               if name == "ddpwatch.render" or name.startswith("ddpwatch.render.")])


def test_the_analysis_imports_no_wording_defines_none_and_builds_no_sentences():
    modules = _modules()
    found = [problem for module, path in modules.items() if _stage(module) == "ddpwatch.analysis"
             for problem in _wording_in(module, path, modules)]
    assert found == []
    assert "ddpwatch.render.wording" in modules  # where the words went


def test_the_wording_check_finds_prose_and_wording_helpers(tmp_path):
    path = tmp_path / "pass.py"
    path.write_text('"""A module."""\n\ndef rank_list(ranks):\n    """Its docstring is fine."""\n'
                    '    return f"ranks {ranks} wait forever"\n\nTAKES = "live, blocked, timeout"\n')
    found = _wording_in("ddpwatch.analysis.toy", str(path), {})
    assert found == ["ddpwatch.analysis.toy defines rank_list",
                     "ddpwatch.analysis.toy:5 builds words: 'ranks {} wait forever'"]
