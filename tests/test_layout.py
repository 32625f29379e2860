"""The package's shape: imports point one way (no cycle, function-level imports included), one catalogue, one table
of output formats."""

import ast
import dataclasses
import os

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
           "ddpwatch.catalogue", "ddpwatch.frames", "ddpwatch.atomic", "ddpwatch.logonce")


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


def _source_lines(exclude: str) -> list:
    """(module, line number, line) of every line of ddpwatch/ outside `exclude`, comments and docstrings included."""
    found = []
    for module, path in _modules().items():
        if module != exclude:
            for number, line in enumerate(open(path, encoding="utf-8"), 1):
                found.append((module, number, line))
    return found


def test_only_the_atomic_writer_renames():
    """Four hand-rolled atomic writes (temp file + rename) were one too many: every rename is ddpwatch.atomic's."""
    renames = [f"{module}:{number}" for module, number, line in _source_lines("ddpwatch.atomic")
               if "os.replace" in line or "os.rename" in line]
    assert renames == []


# What classifying a frame by its file looks like: only ddpwatch.frames may do it (live and offline disagreed).
_PATH_MARKERS = ("site-packages", "dist-packages", "python3", "ddpwatch[", "stdlib")


def _classifying_constants(path: str) -> list:
    """(line, text) of string constants that look like frame classification: a path piece or a pattern (no space:
    prose in a help text or a message is not classification), and imports of sysconfig."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    skipped = {id(node) for top in ast.walk(tree) if isinstance(top, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "_SKIPPED_DIRS" for t in top.targets)
               for node in ast.walk(top)}  # lint's folders it never walks into: not frames
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped \
                and " " not in node.value and any(marker in node.value for marker in _PATH_MARKERS):
            found.append((node.lineno, node.value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            found += [(node.lineno, "import sysconfig") for name in names if name == "sysconfig"]
    return found


def test_only_the_frame_classifier_classifies_paths():
    elsewhere = [f"{module}:{line}: {text}" for module, path in _modules().items() if module != "ddpwatch.frames"
                 for line, text in _classifying_constants(path)]
    assert elsewhere == []


def test_the_path_classification_check_finds_a_copy():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write('import sysconfig\nMARK = "site-packages" + os.sep\nHELP = "in site-packages or not"\n')
    try:
        assert [text for _, text in _classifying_constants(handle.name)] == ["import sysconfig", "site-packages"]
    finally:
        os.unlink(handle.name)


def test_one_log_once_helper():
    """Three modules each kept a set and warned the first time a key was seen: ddpwatch.logonce is the one now."""
    import re

    copies = []
    for module, path in _modules().items():
        lines = open(path, encoding="utf-8").read().split("\n")
        for number, line in enumerate(lines):
            window = "\n".join(lines[number:number + 4])  # a key added to a set, then a warning about it
            if module != "ddpwatch.logonce" and re.search(r"\.add\(\w+\)", line) and ".warning(" in window:
                copies.append(f"{module}:{number + 1}")
    assert copies == []


def test_log_once_warns_once_per_key_and_set(caplog):
    from ddpwatch.logonce import log_once

    seen: set = set()
    for _ in range(3):
        log_once(seen, "a", "ddpwatch: %s", "first")
    log_once(seen, "b", "ddpwatch: second")
    log_once(set(), "a", "ddpwatch: another watchdog's own")
    assert [r.getMessage() for r in caplog.records] == ["ddpwatch: first", "ddpwatch: second",
                                                      "ddpwatch: another watchdog's own"]
