"""The one door for patches (capture/replacements.py): marked, idempotent, undone newest first; nobody else marks."""

import importlib
import os
import re
import sys
import types

from ddpwatch.capture import after_import
from ddpwatch.capture.after_import import when_imported
from ddpwatch.capture.replacements import PATCH_MARKER, Patches

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ddpwatch")


def _module():
    module = types.SimpleNamespace()
    module.f = lambda x: x + 1
    return module


def test_a_wrapped_function_is_marked_with_its_original_and_wrapping_again_does_nothing():
    module, patches = _module(), Patches()
    original = module.f
    assert patches.wrap(module, "f", lambda orig: lambda x: orig(x) * 10) is original
    assert module.f(1) == 20 and getattr(module.f, PATCH_MARKER) is original
    assert patches.wrap(module, "f", lambda orig: lambda x: 0) is None  # already ddpwatch's: idempotent
    assert patches.wrap(module, "missing", lambda orig: orig) is None
    assert module.f(1) == 20
    patches.undo()
    assert module.f is original and not patches


def test_undo_restores_newest_first_so_a_twice_replaced_attribute_gets_its_first_original():
    module, patches = _module(), Patches()
    original = module.f
    patches.replace(module, "f", lambda x: "first")
    patches.replace(module, "f", lambda x: "second")
    patches.undo()
    assert module.f is original


def test_a_hook_that_outlives_sessions_leaves_what_the_program_installed_over_it():
    module, patches = _module(), Patches()
    original = module.f
    patches.replace(module, "f", lambda x: "ours")
    theirs = module.f = lambda x: "the program's"
    patches.undo(only_where_ours=True)
    assert module.f is theirs
    other, patches = _module(), Patches()
    kept = other.f
    patches.replace(other, "f", lambda x: "ours")
    patches.undo(only_where_ours=True)
    assert other.f is kept and original is not kept


def test_only_the_door_marks_a_patch():
    """Patcher, the session's lifecycle hooks and DDPWATCH=1's activation hook all go through Patches."""
    marking = re.compile(r"setattr\([^)]*PATCH_MARKER|__ddpwatch_original__\s*=")
    found = []
    for folder, _, files in os.walk(ROOT):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and not path.endswith(os.path.join("capture", "replacements.py")):
                with open(path, encoding="utf-8") as handle:
                    found += [f"{path}:{n}" for n, line in enumerate(handle, 1) if marking.search(line)]
    assert found == []


def _module_file(tmp_path, monkeypatch, name):
    (tmp_path / f"{name}.py").write_text("def f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_a_patch_on_a_module_not_imported_waits_for_the_programs_import_and_is_undone(tmp_path, monkeypatch):
    name, patches = _module_file(tmp_path, monkeypatch, "ddpwatch_probe_later"), Patches()
    patches.wrap_when_imported(name, "f", "__call__", lambda orig: orig)  # an owner without it: nothing, no error
    patches.wrap_when_imported(name, "__name__", "upper", lambda orig: orig)  # a str's method cannot be set: logged
    assert name not in sys.modules  # patching imported nothing
    module = importlib.import_module(name)
    assert module.f(1) == 2
    assert type(module.__loader__).__name__ == "SourceFileLoader"  # its own loader, not ddpwatch's
    assert after_import._FINDER not in sys.meta_path  # nothing waits any more: it left
    patches.undo()


def test_the_wrapper_goes_on_at_the_import_and_comes_off_at_undo(tmp_path, monkeypatch):
    name, patches = _module_file(tmp_path, monkeypatch, "ddpwatch_probe_wrap"), Patches()
    (tmp_path / f"{name}.py").write_text("class Owner:\n    def f(self):\n        return 1\n")
    patches.wrap_when_imported(name, "Owner", "f", lambda orig: lambda self: orig(self) * 10)
    module = importlib.import_module(name)
    assert module.Owner().f() == 10
    original = getattr(module.Owner.f, PATCH_MARKER)
    patches.undo()
    assert module.Owner.f is original and module.Owner().f() == 1


def test_a_module_already_imported_is_patched_at_once(tmp_path, monkeypatch):
    name, patches = _module_file(tmp_path, monkeypatch, "ddpwatch_probe_now"), Patches()
    (tmp_path / f"{name}.py").write_text("class Owner:\n    def f(self):\n        return 1\n")
    module = importlib.import_module(name)
    patches.wrap_when_imported(name, "Owner", "f", lambda orig: lambda self: 2)
    assert module.Owner().f() == 2
    patches.undo()
    assert module.Owner().f() == 1


def test_undone_before_the_import_nothing_is_patched_and_no_finder_is_left(tmp_path, monkeypatch):
    name, patches = _module_file(tmp_path, monkeypatch, "ddpwatch_probe_cancelled"), Patches()
    (tmp_path / f"{name}.py").write_text("class Owner:\n    def f(self):\n        return 1\n")
    patches.wrap_when_imported(name, "Owner", "f", lambda orig: lambda self: 2)
    assert after_import._FINDER in sys.meta_path
    patches.undo()
    assert after_import._FINDER not in sys.meta_path
    assert importlib.import_module(name).Owner().f() == 1


def test_a_patch_that_fails_at_the_import_is_logged_and_the_import_succeeds(tmp_path, monkeypatch, caplog):
    name = _module_file(tmp_path, monkeypatch, "ddpwatch_probe_failing")

    def broken(module):
        raise RuntimeError("a torch with other internals")

    hook = when_imported(name, broken)
    module = importlib.import_module(name)
    assert module.f(1) == 2
    assert "could not patch ddpwatch_probe_failing" in caplog.text
    hook.cancel()


def test_a_module_whose_import_fails_keeps_its_own_loader_and_its_hook_waits_for_the_next_import(tmp_path, monkeypatch):
    name = _module_file(tmp_path, monkeypatch, "ddpwatch_probe_broken_once")
    source = tmp_path / f"{name}.py"
    source.write_text("raise ImportError('not yet')\n")
    seen = []
    hook = when_imported(name, lambda module: seen.append(module.f(1)))
    try:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
        assert seen == [] and name not in sys.modules and after_import._FINDER in sys.meta_path
        source.write_text("def f(x):\n    return x + 1\n")
        importlib.invalidate_caches()  # the finder is asked too: it must take the call (it caches nothing)
        module = importlib.import_module(name)
        assert seen == [2] and type(module.__loader__).__name__ == "SourceFileLoader"
        assert module.__spec__.loader is module.__loader__ and after_import._FINDER not in sys.meta_path
    finally:
        hook.cancel()
