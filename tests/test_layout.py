"""The package's shape: imports point one way (no cycle, function-level imports included), one catalogue, one table
of output formats."""

import ast
import dataclasses
import os
import re

from ddpwatch import catalogue, lint
from ddpwatch.capture import wrappers
from ddpwatch.render import report

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ddpwatch")


def _modules() -> dict:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = "ddpwatch." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module[: -len(".__init__")] if module.endswith(".__init__") else module] = path
    return found


def _imports(module: str, path: str, modules: dict) -> set:
    """Every ddpwatch module `module` imports, at its top or inside a function."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
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
                return path[path.index(nxt) :] + [nxt]
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
    # the reader sees function-level and package imports
    assert "ddpwatch.sources.merge" in graph["ddpwatch.sources.report_command"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_a_cycle_is_found_when_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_patching_lint_and_the_flight_recorder_read_one_catalogue():
    tensor = catalogue.tensor_collectives()
    assert set(wrappers.COLLECTIVES) == set(tensor)
    assert set(tensor) <= set(lint.COLLECTIVES)  # every patched collective is also linted
    assert {"all_gather_single", "reduce_scatter_single", "new_group"} <= set(lint.COLLECTIVES)
    assert "send_object_list" not in lint.COLLECTIVES  # point-to-point under a rank condition is normal
    assert catalogue.canonical_op("allreduce") == "all_reduce" == catalogue.canonical_op("all_reduce_coalesced")


def test_every_output_format_is_one_row_and_the_command_offers_exactly_those():
    from ddpwatch import cli

    assert report.FORMATS == tuple(report.RENDERERS) == cli.report_formats()
    names = [row[0] for row in report.RENDERERS.values()]
    assert len(set(names)) == len(names)


# The pipeline's stages as packages, and what each may import besides the shared top-level modules (catalogue,
# config, private): capture <- watch -> analysis -> render (the watchdog thread reads what the training thread
# recorded, never the other way), and sources -> analysis, render; the report format (its types,
# builders, checks, load and save) sits below them all and imports none of them. The static analysis of the user's
# source (static: lint, the rank-condition recogniser) is read by the runtime and the loaders when an incident is
# taken or an old one loaded, never by the analysis or the renderers: they read only the incident.
MAY_IMPORT = {
    "ddpwatch.capture": {"ddpwatch.format", "ddpwatch.static"},
    "ddpwatch.watch": {
        "ddpwatch.capture",
        "ddpwatch.format",
        "ddpwatch.analysis",
        "ddpwatch.render",
        "ddpwatch.static",
    },
    "ddpwatch.sources": {"ddpwatch.format", "ddpwatch.analysis", "ddpwatch.render", "ddpwatch.static"},
    "ddpwatch.analysis": {"ddpwatch.format"},
    "ddpwatch.render": {"ddpwatch.format", "ddpwatch.analysis"},
    "ddpwatch.static": {"ddpwatch.format"},
    "ddpwatch.format": set(),
}
OFFLINE = (
    "ddpwatch.analysis",
    "ddpwatch.render",
    "ddpwatch.sources",
    "ddpwatch.static",
    "ddpwatch.format",
    "ddpwatch.catalogue",
    "ddpwatch.flight_entries",
    "ddpwatch.frames",
    "ddpwatch.atomic",
    "ddpwatch.logonce",
    "ddpwatch.terminal",
)


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
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
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
                defaults = (
                    [None] * (len(node.args.args) - len(node.args.defaults))
                    + node.args.defaults
                    + node.args.kw_defaults
                )
                literal_defaults += [
                    f"{module}.{node.name}({arg.arg}=...)"
                    for arg, default in zip(args, defaults)
                    if arg.arg in config.DEFAULTS
                    and isinstance(default, ast.Constant)
                    and default.value == config.DEFAULTS[arg.arg]
                ]
    assert literal_defaults == []
    assert {
        f.name: f.default for f in dataclasses.fields(config.Config) if f.name in config.DEFAULTS
    } == config.DEFAULTS


def test_the_shell_side_client_loads_nothing_of_a_live_rank():
    """`ddpwatch dump` runs in a shell: it reads the registry and signals a rank, and imports neither the training
    thread's code (capture) nor the watchdog's (watch)."""
    modules = _modules()
    for client in ("ddpwatch.dump_client", "ddpwatch.registry"):
        imported = _imports(client, modules[client], modules)
        assert not [name for name in imported if name.startswith(("ddpwatch.capture", "ddpwatch.watch"))], client


def test_terminal_safe_text_is_a_module_of_its_own():
    """visible()/say() are used by the renderers, the watchdog, the CLI and `ddpwatch dump`: escaping a string must
    not load a renderer, so terminal.py imports nothing of ddpwatch and nothing imports render to escape."""
    modules = _modules()
    assert _imports("ddpwatch.terminal", modules["ddpwatch.terminal"], modules) == set()
    from ddpwatch import render

    assert not hasattr(render, "visible")


def test_a_ranks_file_has_one_encoder():
    """rank-<r>.json is written by the incident folder (render/report.py) and a rank's local dump (watch/
    incident_writer.py): both take its name and bytes from format/documents.py, which nothing else spells."""
    spelled = [
        module
        for module, path in _modules().items()
        if module != "ddpwatch.format.documents"
        and re.search(r"rank-\{[^}]*\}\.json", open(path, encoding="utf-8").read())
    ]
    assert spelled == []
    from ddpwatch.format import documents

    assert documents.rank_file_name(3) == "rank-3.json"
    assert (
        documents.rank_file_bytes({"rank": 3, "odd": {1}, "text": "\ud800"})
        == b'{"rank":3,"odd":"{1}","text":"\\ud800"}\n'
    )


# The watchdog's parts (issue 20 point 1): the loop calls them, they never call back into it.
WATCHDOG_PARTS = ("peers", "incident_writer", "abort", "rank_state", "answers")


def test_the_watchdogs_parts_never_import_the_watchdog():
    modules = _modules()
    for part in WATCHDOG_PARTS:
        name = f"ddpwatch.watch.{part}"
        assert "ddpwatch.watch.watchdog" not in _imports(name, modules[name], modules), part


# The top-level modules (issue 44 point 4): shared leaves that any stage may use, which import no stage but the
# report format; and entry points (the session, the CLI, the bootstrap...), which may import any stage and which
# no stage and no leaf imports. A new top-level module must be put in one of the two.
SHARED_LEAVES = {
    "ddpwatch.atomic",
    "ddpwatch.catalogue",
    "ddpwatch.config",
    "ddpwatch.config_files",
    "ddpwatch.flight_entries",
    "ddpwatch.frames",
    "ddpwatch.launch",
    "ddpwatch.logonce",
    "ddpwatch.private",
    "ddpwatch.registry",
    "ddpwatch.terminal",
}
ENTRY_POINTS = {
    "ddpwatch.__main__",
    "ddpwatch.bootstrap",
    "ddpwatch.cli",
    "ddpwatch.demo",
    "ddpwatch.dump_client",
    "ddpwatch.examples",
    "ddpwatch.lint",
    "ddpwatch.session",
}


def _top_level(modules: dict) -> set:
    return {module for module in modules if module.count(".") == 1 and _stage(module) is None}


def _top_level_import_errors(modules: dict, graph: dict) -> list:
    wrong = [
        f"{module} is neither a shared leaf nor an entry point"
        for module in sorted(_top_level(modules) - SHARED_LEAVES - ENTRY_POINTS)
    ]

    def entry(module):  # a package's own modules (bootstrap.sitecustomize) are that entry point too
        return any(module == point or module.startswith(point + ".") for point in ENTRY_POINTS)

    for module in sorted(graph):
        for imported in sorted(graph[module]):
            if entry(imported) and not entry(module):
                wrong.append(f"{module} imports the entry point {imported}")
            elif module in SHARED_LEAVES and imported not in SHARED_LEAVES and _stage(imported) != "ddpwatch.format":
                wrong.append(f"the shared leaf {module} imports {imported}")
    return wrong


def test_the_top_level_modules_are_leaves_or_entry_points_and_imports_point_one_way():
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    assert _top_level_import_errors(modules, graph) == []


def test_the_top_level_check_finds_a_leaf_importing_a_stage_and_a_stage_importing_the_session():
    modules = dict.fromkeys(["ddpwatch.config", "ddpwatch.session", "ddpwatch.watch.store", "ddpwatch.new"], "")
    graph = {
        "ddpwatch.config": {"ddpwatch.watch.store"},
        "ddpwatch.watch.store": {"ddpwatch.session"},
        "ddpwatch.session": {"ddpwatch.watch.store"},
        "ddpwatch.new": set(),
    }
    assert _top_level_import_errors(modules, graph) == [
        "ddpwatch.new is neither a shared leaf nor an entry point",
        "the shared leaf ddpwatch.config imports ddpwatch.watch.store",
        "ddpwatch.watch.store imports the entry point ddpwatch.session",
    ]


# The watchdog alone decides and acts (issue 44 point 4): its parts are given data and return results. Neither the
# Watchdog nor the Session hands itself, or a method of itself, to anything it calls or constructs: what another
# thread must tell the watchdog goes through its mailbox (watch/mailbox.py), events and values.
HOLDERS = {"ddpwatch.watch.watchdog": "Watchdog", "ddpwatch.session": "Session"}


def _handed_out(source: str, class_name: str) -> list:
    """Each call inside `class_name`'s methods given `self`, a bound method of the class, or a lambda or nested
    function that calls one (super() aside): 'method: call(argument)'."""
    [cls] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name]
    methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def is_self_or_method(node) -> bool:
        if isinstance(node, ast.Name) and node.id == "self":
            return True
        return (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and (node.attr in methods)
        )

    def hands_self(node) -> bool:
        if is_self_or_method(node):
            return True
        if isinstance(node, ast.Lambda):  # a closure that calls back: `lambda: self.run_incident(...)`
            return any(isinstance(n, ast.Call) and is_self_or_method(n.func) for n in ast.walk(node.body))
        return False

    found = []
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for call in [n for n in ast.walk(method) if isinstance(n, ast.Call)]:
            if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Call):
                if isinstance(call.func.value.func, ast.Name) and call.func.value.func.id == "super":
                    continue
            for argument in list(call.args) + [keyword.value for keyword in call.keywords]:
                if hands_self(argument):
                    found.append(f"{method.name}: {ast.unparse(call.func)}({ast.unparse(argument)})")
    return found


def test_neither_the_watchdog_nor_the_session_hands_itself_or_a_method_of_itself_to_a_part():
    modules = _modules()
    handed = {
        module: _handed_out(open(modules[module], encoding="utf-8").read(), name) for module, name in HOLDERS.items()
    }
    assert handed == {module: [] for module in HOLDERS}


def test_the_hand_out_check_finds_self_a_bound_method_and_a_closure():
    source = (
        "class Watchdog:\n"
        "    def __init__(self):\n"
        "        super().__init__(name='x')\n"
        "        self.catch_up = CatchUp(self.policy, self.wake)\n"
        "        self.parts = Part(self)\n"
        "        self.ok = Part(self.job.run, self.recorder)\n"
        "        hook(lambda: self.run_incident(1))\n"
        "    def wake(self):\n"
        "        pass\n"
        "    def run_incident(self, n):\n"
        "        crashes.report_vanished(self, n)\n"
    )
    assert _handed_out(source, "Watchdog") == [
        "__init__: CatchUp(self.wake)",
        "__init__: Part(self)",
        "__init__: hook(lambda: self.run_incident(1))",
        "run_incident: crashes.report_vanished(self)",
    ]


def test_no_part_reaches_the_watchdog_or_the_session_by_name():
    """A part handed something else can still reach back: `getattr(session, "watchdog")`, a parameter named `dog`.
    Outside the session (which owns the watchdog) no module reads a `watchdog` attribute or names a parameter for
    either."""
    reaching = []
    for module, path in _modules().items():
        if module == "ddpwatch.session":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Attribute) and node.attr == "watchdog":
                reaching.append(f"{module}: .{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and any(isinstance(a, ast.Constant) and a.value in ("watchdog", "session") for a in node.args)
            ):
                reaching.append(f"{module}: {ast.unparse(node)}")
            elif isinstance(node, ast.arg) and node.arg in ("dog", "watchdog", "session"):
                reaching.append(f"{module}: parameter {node.arg}")
    assert reaching == []


def test_the_peer_tracker_reads_no_clock_and_touches_no_store_or_thread():
    path = _modules()["ddpwatch.watch.peers"]
    imported = {
        alias.name
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not imported & {"time", "threading", "store", "JobProtocol", "socket"}


def test_the_watchdog_class_stays_a_loop_that_calls_its_parts():
    tree = ast.parse(open(_modules()["ddpwatch.watch.watchdog"], encoding="utf-8").read())
    [watchdog] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Watchdog"]
    assert watchdog.end_lineno - watchdog.lineno < 300


# Keys only a record and only a rank state have: a dict literal holding them outside the builders is a second
# definition of the format (records were written in three places, rank states in two).
BUILT_ONLY_BY = {"record": {"seq", "group", "op", "p2p"}, "rank_state": {"format_version", "rank", "world_size"}}
BUILDERS = os.path.join(ROOT, "format", "build.py")


def _literal_documents(path: str) -> list:
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Dict):
            keys = {key.value for key in node.keys if isinstance(key, ast.Constant)}
            found += [f"line {node.lineno}: a {kind}" for kind, marks in BUILT_ONLY_BY.items() if marks <= keys]
    return found


def test_records_and_rank_states_are_built_only_by_the_format_builders():
    written = {module: _literal_documents(path) for module, path in _modules().items() if path != BUILDERS}
    assert {module: found for module, found in written.items() if found} == {}
    assert len(_literal_documents(BUILDERS)) == 2  # the check sees the builders' own literals


# Leaf modules that import nothing of ddpwatch's stages: documents.py saves through them (the atomic writer, this
# user's private folders, terminal-safe text for the one-line note saying where a report went instead).
FORMAT_MAY_USE = ("ddpwatch.atomic", "ddpwatch.private", "ddpwatch.terminal")


def test_the_format_package_imports_no_other_ddpwatch_module():
    """Every stage reads and writes the format, so it sits below them all: capture, watch, sources, analysis, render.
    It saves what it loads (format/documents.py) through the leaf modules of FORMAT_MAY_USE, which stay leaves."""
    modules = _modules()
    outside = [
        f"{module} imports {imported}"
        for module, path in modules.items()
        if module.startswith("ddpwatch.format")
        for imported in _imports(module, path, modules)
        if not imported.startswith("ddpwatch.format") and imported not in FORMAT_MAY_USE
    ]
    assert outside == []
    below = [
        f"{module} imports {imported}"
        for module in FORMAT_MAY_USE
        for imported in _imports(module, modules[module], modules)
        if imported not in FORMAT_MAY_USE
    ]
    assert below == []


# What reads a file: modules whose business is files or source text, and the calls that open or look at one.
_FILE_MODULES = frozenset(
    {
        "io",
        "os",
        "pathlib",
        "linecache",
        "tokenize",
        "inspect",
        "glob",
        "shutil",
        "mmap",
        "importlib",
        "fileinput",
        "codecs",
        "zipfile",
        "tarfile",
        "tempfile",
        "runpy",
        "builtins",
    }
)
_FILE_CALLS = frozenset({"open", "read_text", "read_bytes", "getsource", "getlines", "__import__", "exec", "eval"})


def _file_reads(path: str) -> list:
    """Where the module at `path` imports a file-reading module or names a file-reading call (by AST)."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            names = []
        found += [f"import {name}" for name in names if name.split(".")[0] in _FILE_MODULES]
        if isinstance(node, ast.Name) and node.id in _FILE_CALLS:
            found.append(f"{node.id} (line {node.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr in _FILE_CALLS:
            found.append(f".{node.attr} (line {node.lineno})")
    return found


def test_a_file_read_is_found_when_there_is_one(tmp_path):
    path = tmp_path / "reads.py"
    path.write_text("import linecache\nfrom pathlib import Path\nopen('x')\nPath('y').read_text()\n")
    assert _file_reads(str(path)) == ["import linecache", "import pathlib", "open (line 3)", ".read_text (line 4)"]


def test_the_analysis_reads_no_file_and_no_source():
    """The analysis works on the incident alone, so --reanalyze gives the same report on any machine: rank
    conditions are read from the sources when the incident is taken (watch, sources), never here."""
    modules = _modules()
    reads = {module: _file_reads(path) for module, path in modules.items() if module.startswith("ddpwatch.analysis")}
    assert {module: found for module, found in reads.items() if found} == {}
    wrong = [
        f"{module} imports {imported}"
        for module, path in modules.items()
        if module.startswith("ddpwatch.analysis")
        for imported in _imports(module, path, modules)
        if imported.startswith(
            ("ddpwatch.static", "ddpwatch.capture", "ddpwatch.watch", "ddpwatch.sources", "ddpwatch.lint")
        )
    ]
    assert wrong == []


def test_the_static_analysis_package_keeps_its_modules_small():
    """lint.py was 1,029 lines; split into ddpwatch/static/, each module stays under the project's 600."""
    sizes = {
        module: sum(1 for _ in open(path, encoding="utf-8"))
        for module, path in _modules().items()
        if module.startswith("ddpwatch.static") or module in ("ddpwatch.lint", "ddpwatch.analysis.conditions")
    }
    assert len(sizes) >= 7 and {module: size for module, size in sizes.items() if size > 600} == {}


# ---------------------------------------------------------------- the analysis hands over facts; render words them

# The words of a report live in ddpwatch/render/wording.py (issue 20): no analysis module defines these.
WORDING_NAMES = ("describe_op", "rank_list", "FRAMEWORK_FIXES", "framework_fix", "SENTENCES")
_NAME_LIST = re.compile(r"\w+(, \w+)*")  # a Stage's `takes` ("live, blocked, timeout") names arguments: no prose


def _defined_names(tree: ast.AST) -> set:
    defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return defined | {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }


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
    texts += [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]
    return sorted(
        (line, text) for line, text in texts if len(text.split()) >= 3 and not _NAME_LIST.fullmatch(text.strip())
    )


def _wording_in(module: str, path: str, modules: dict) -> list:
    tree = ast.parse(open(path, encoding="utf-8").read())
    return (
        [f"{module} defines {name}" for name in sorted(_defined_names(tree)) if name in WORDING_NAMES]
        + [f"{module}:{line} builds words: {text!r}" for line, text in _sentences(tree)]
        + [
            f"{module} imports {name}"
            for name in sorted(_imports(module, path, modules))
            if name == "ddpwatch.render" or name.startswith("ddpwatch.render.")
        ]
    )


def test_the_analysis_imports_no_wording_defines_none_and_builds_no_sentences():
    modules = _modules()
    found = [
        problem
        for module, path in modules.items()
        if _stage(module) == "ddpwatch.analysis"
        for problem in _wording_in(module, path, modules)
    ]
    assert found == []
    assert "ddpwatch.render.wording" in modules  # where the words went


def test_the_wording_check_finds_prose_and_wording_helpers(tmp_path):
    path = tmp_path / "pass.py"
    path.write_text(
        '"""A module."""\n\ndef rank_list(ranks):\n    """Its docstring is fine."""\n'
        '    return f"ranks {ranks} wait forever"\n\nTAKES = "live, blocked, timeout"\n'
    )
    found = _wording_in("ddpwatch.analysis.toy", str(path), {})
    assert found == [
        "ddpwatch.analysis.toy defines rank_list",
        "ddpwatch.analysis.toy:5 builds words: 'ranks {} wait forever'",
    ]


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
    renames = [
        f"{module}:{number}"
        for module, number, line in _source_lines("ddpwatch.atomic")
        if "os.replace" in line or "os.rename" in line
    ]
    assert renames == []


# What classifying a frame by its file looks like: only ddpwatch.frames may do it (live and offline disagreed).
_PATH_MARKERS = ("site-packages", "dist-packages", "python3", "ddpwatch[", "stdlib")


def _classifying_constants(path: str) -> list:
    """(line, text) of string constants that look like frame classification: a path piece or a pattern (no space:
    prose in a help text or a message is not classification), and imports of sysconfig."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    skipped = {
        id(node)
        for top in ast.walk(tree)
        if isinstance(top, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_SKIPPED_DIRS" for t in top.targets)
        for node in ast.walk(top)
    }  # lint's folders it never walks into: not frames
    patterns = {
        id(node)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "compile"
        for node in call.args
    }  # a regex is classification even with a space in it ("^<ddpwatch ")
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skipped
            and (" " not in node.value or id(node) in patterns)
            and any(marker in node.value for marker in _PATH_MARKERS)
        ):
            found.append((node.lineno, node.value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            found += [(node.lineno, "import sysconfig") for name in names if name == "sysconfig"]
    return found


def test_only_the_frame_classifier_classifies_paths():
    elsewhere = [
        f"{module}:{line}: {text}"
        for module, path in _modules().items()
        if module != "ddpwatch.frames"
        for line, text in _classifying_constants(path)
    ]
    assert elsewhere == []


def test_the_path_classification_check_finds_a_copy():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(
            'import sysconfig\nMARK = "site-packages" + os.sep\nHELP = "in site-packages or not"\n'
            'OWN = re.compile(r"ddpwatch[/]|^<ddpwatch ")\n'
        )
    try:
        assert [text for _, text in _classifying_constants(handle.name)] == [
            "import sysconfig",
            "site-packages",
            "ddpwatch[/]|^<ddpwatch ",
        ]
    finally:
        os.unlink(handle.name)


def test_one_log_once_helper():
    """Three modules each kept a set and warned the first time a key was seen: ddpwatch.logonce is the one now."""
    import re

    copies = []
    for module, path in _modules().items():
        lines = open(path, encoding="utf-8").read().split("\n")
        for number, line in enumerate(lines):
            window = "\n".join(lines[number : number + 4])  # a key added to a set, then a warning about it
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
    assert [r.getMessage() for r in caplog.records] == [
        "ddpwatch: first",
        "ddpwatch: second",
        "ddpwatch: another watchdog's own",
    ]


MAX_MODULE_LINES = 600  # issue 20: a module over this holds more than one thing (watchdog.py was 726, lint.py 1,029)


def test_no_module_is_over_six_hundred_lines():
    sizes = {module: sum(1 for _ in open(path, encoding="utf-8")) for module, path in _modules().items()}
    assert len(sizes) > 50  # the walk sees the whole package
    assert {module: size for module, size in sizes.items() if size > MAX_MODULE_LINES} == {}


# ---------------------------------------------------------------- render words facts, it never reads English back

_RE_FUNCTIONS = {"compile", "search", "match", "fullmatch", "sub", "subn", "findall", "finditer", "split"}


def _patterns_over_rank_words(path: str) -> list:
    """(line, text) of each regular expression over rank words in a module: a string passed to re.* that names
    ranks, or any string that names ranks next to a digit class (a pattern kept in a constant)."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _RE_FUNCTIONS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
        ):
            texts = [
                n.value
                for arg in node.args
                for n in ast.walk(arg)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            found += [(node.lineno, text) for text in texts if "ank" in text.lower()]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "ank" in node.value.lower() and "\\d" in node.value:
                found.append((node.lineno, node.value))
    return found


def test_render_parses_no_rank_list_out_of_english():
    """Issue 20: report.txt and report.html word each finding from its facts (short rank lists); no renderer
    regex-parses rank runs out of prose any more."""
    found = [
        f"{module}:{line}: {text}"
        for module, path in _modules().items()
        if module.startswith("ddpwatch.render")
        for line, text in _patterns_over_rank_words(path)
    ]
    assert found == []


def test_the_rank_words_check_finds_a_rank_parser():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(
            'import re\nRUN = re.compile(r"\\b([Rr])anks ((?:\\d+(?:-\\d+)?,)+\\d+(?:-\\d+)?)")\n'
            'KEPT = r"ranks (\\d+)"\nre.sub("Ranks", "", "x")\nHELP = "ranks 0-3"\n'
        )
    try:
        assert sorted(line for line, _ in _patterns_over_rank_words(handle.name)) == [2, 2, 3, 4]
    finally:
        os.unlink(handle.name)


# Issue 20: the Recorder was a bag of public fields that the Patcher and the watchdog wrote. Now it owns its state:
# others read properties and say what happened through its methods (note_group, note_ddp_forward...).
_MUTATORS = frozenset(
    {
        "append",
        "appendleft",
        "add",
        "clear",
        "pop",
        "popitem",
        "popleft",
        "update",
        "discard",
        "remove",
        "setdefault",
        "extend",
        "insert",
        "__setitem__",
        "__delitem__",
    }
)


def _is_recorder(node) -> bool:
    """`recorder` or `<anything>.recorder`: how ddpwatch's modules name the Recorder they hold."""
    return (isinstance(node, ast.Name) and node.id == "recorder") or (
        isinstance(node, ast.Attribute) and node.attr == "recorder"
    )


def _on_recorder_field(node) -> bool:
    """Whether `node` is `<recorder>.<field>`, or an item or attribute reached through one."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and _is_recorder(node.value):
            return True
        node = node.value
    return False


def _recorder_writes(path: str) -> list:
    """Line numbers where the file assigns, augments or deletes a recorder field, or calls a mutator on one."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            targets = [node.func.value]
        flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        if any(_on_recorder_field(target) for target in flat):
            found.append(node.lineno)
    return sorted(set(found))


def test_only_the_recorder_writes_its_fields():
    writes = {
        module: lines
        for module, path in _modules().items()
        if module != "ddpwatch.capture.record"
        for lines in [_recorder_writes(path)]
        if lines
    }
    assert writes == {}


def test_a_write_to_a_recorder_field_is_found_when_there_is_one(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "\n".join(
            [
                "self.recorder.failure_hook = hook",  # 1: assignment
                "recorder.ddp_steps += 1",  # 2: augmented assignment
                "self.recorder.groups[name] = ranks",  # 3: item assignment
                "recorder.busy.add(ident)",  # 4: a mutating call
                "patcher.recorder.inflight.clear()",  # 5
                "a, self.recorder.progress = 1, 2",  # 6: inside a tuple target
                "del recorder.host_sync[name]",  # 7
                "ok = self.recorder.progress_mono + recorder.inflight.get(1, 0)",  # reads are fine
                "recorder.note_group(name, ranks, True); self.recorder.set_failure_hook(None)",  # so are its methods
                "other.busy.add(1); self.cache[k] = v",  # and other objects
            ]
        )
        + "\n"
    )
    assert _recorder_writes(str(planted)) == [1, 2, 3, 4, 5, 6, 7]
