"""Zero-code activation: with DDPWATCH=1, every Python process that starts watches its process group, if it gets one.

Reached at interpreter start-up from two places, whichever comes first (the second call does nothing):
- ddpwatch-startup.pth in site-packages, installed with the package (like coverage.py's process_startup()): its
  one line imports the top-level _ddpwatch_startup module only when DDPWATCH is set, which calls here once
  site.py has finished;
- sitecustomize.py in this folder, which `ddpwatch run -- CMD` puts first on PYTHONPATH (like ddtrace-run).

At start-up this only glances at the environment and the working directory (no module beyond os, sys and the
post-import finder of capture/after_import.py, which imports built-ins only: 1-2 ms)
and registers an import hook; torch is not imported. Where there are settings to read (DDPWATCH_* variables, a
setup.cfg or pyproject.toml that mentions ddpwatch, a DDPWATCH value other than on/off) the configuration is read
at once, so that a bad one is said in the process that has it (about 20 ms more). Once
torch.distributed has been imported, init_process_group is wrapped; its first call installs the guard, which arms
the watchdog. A process that never creates a process group (torchrun's agent, DataLoader workers, pip, any
unrelated program) is not disturbed: a bad or unreadable setting is one warning line there, and the ConfigError
with its reason is raised by the first init_process_group, where the guard starts.
"""

from __future__ import annotations

import os
import sys

BOOTSTRAP_DIR = os.path.dirname(os.path.abspath(__file__))
PTH_NAME = "ddpwatch-startup.pth"
HOOKED_MODULE = "torch.distributed"

activated_by = ""  # "pth" or "sitecustomize": which start-up path activated this process ("" if none)
_started = False


# What DDPWATCH may say at a glance (config's enabled option accepts exactly these, and says why for anything else:
# tests/test_activation.py keeps the two in step).
ON_WORDS = ("1", "true", "yes", "on")
OFF_WORDS = ("0", "false", "no", "off", "")
SETTINGS_FILES = ("setup.cfg", "pyproject.toml")


def process_startup(via: str = "pth") -> bool:
    """Activate ddpwatch in this process if DDPWATCH asks for it; refuses to run twice; never raises."""
    global _started, activated_by
    if _started:
        return False
    _started = True
    try:
        enabled = _enabled_at_a_glance(os.environ)
        if enabled is False:
            return False
        if enabled is None or _settings_to_read(os.environ, os.getcwd()):
            from .. import config

            try:
                if not config.is_enabled_in():
                    return False
                config.load()  # a bad value is said now, once, in every process, but raised only where the guard starts
            except config.ConfigError as exc:
                _warn_bad_setting(exc)  # and hook init_process_group all the same: that is where the error is raised
    except Exception as exc:
        _warn(exc)
        return False
    try:
        install_import_hook()
    except Exception as exc:
        _warn(exc)
        return False
    activated_by = via
    return True


def _enabled_at_a_glance(environ) -> bool | None:
    """DDPWATCH's word, read without the configuration module: None when it is neither on nor off (then the
    configuration reads it, and says what is wrong)."""
    raw = environ.get("DDPWATCH")
    if raw is None:
        return False
    word = raw.strip().lower()
    return True if word in ON_WORDS else False if word in OFF_WORDS else None


def _settings_to_read(environ, cwd: str) -> bool:
    """Whether anything but DDPWATCH may hold a setting: a DDPWATCH_* variable (a misspelt one too), or a settings
    file in the working directory that mentions ddpwatch (or cannot be read: the configuration says so)."""
    if any(name.upper().startswith("DDPWATCH") and name != "DDPWATCH" for name in environ):
        return True
    for name in SETTINGS_FILES:
        try:
            with open(os.path.join(cwd, name), "rb") as handle:
                if b"ddpwatch" in handle.read().lower():
                    return True
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue
        except OSError:
            return True
    return False


def _warn_bad_setting(exc: Exception) -> None:
    """One line: DDPWATCH=1 is inherited by every Python process (pip, editors' helpers, torchrun's agent), and
    most never create a process group, so a typo must not stop them; a rank still fails, at init_process_group."""
    reason = " ".join(str(exc).split())  # one line, whatever the parser's message looked like
    try:
        sys.stderr.write(
            f"{reason} -- ddpwatch is inactive in this process; init_process_group will raise this "
            f"error until the setting is fixed (or DDPWATCH is unset)\n"
        )
    except Exception:
        pass


def _warn(exc: BaseException) -> None:
    try:
        sys.stderr.write(
            f"ddpwatch: start-up activation failed ({type(exc).__name__}: {exc}); this process runs unwatched\n"
        )
    except Exception:
        pass


def install_import_hook() -> None:
    """Wrap init_process_group once torch.distributed has been imported (now, if it already is)."""
    from ..capture.after_import import when_imported  # the one post-import finder: built-in modules only

    when_imported(HOOKED_MODULE, _on_imported)


def _on_imported(module) -> None:
    try:
        from ..session import activate_on_init

        activate_on_init()
    except Exception as exc:
        _warn(exc)
