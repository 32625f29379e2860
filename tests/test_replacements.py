"""The one door for patches (capture/replacements.py): marked, idempotent, undone newest first; nobody else marks."""

import os
import re
import types

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
