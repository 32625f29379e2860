"""ddpwatch's settings files: setup.cfg's [ddpwatch] and pyproject.toml's [tool.ddpwatch], read as written."""

from __future__ import annotations

import os
import re
import sys


def _toml():
    """tomllib (3.11+), or tomli, its earlier name; None without either. Imported when a pyproject.toml is read,
    not with this module: under DDPWATCH=1 with settings in the environment every Python process imports it."""
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python < 3.11: the same parser, published as tomli
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return None
    return tomllib


class ConfigError(ValueError):
    """A configuration value that ddpwatch cannot accept; raised before training starts, never mid-run."""


ConfigError.__module__ = "ddpwatch.config"  # where users meet it: `except ddpwatch.config.ConfigError`


# ---------------------------------------------------------------- names ddpwatch does not know: warn once

_warned: set = set()  # one warning per process for each unknown name


def warn_once(key: str, message: str) -> None:
    """On stderr through the ddpwatch logger (Python's last-resort handler when the program set up none)."""
    from .logonce import log_once

    log_once(_warned, key, message)


def did_you_mean(word: str, choices) -> str:
    import difflib  # only when something is misspelt: start-up under DDPWATCH=1 stays lean

    close = difflib.get_close_matches(word.lower(), list(choices), n=1, cutoff=0.6)
    return close[0] if close else ""


def file_settings(cwd: str) -> list:
    """[(source, {name: raw})] from setup.cfg's [ddpwatch] and pyproject.toml's [tool.ddpwatch], in that order."""
    found = []
    setup_cfg = os.path.join(cwd, "setup.cfg")
    if os.path.isfile(setup_cfg):
        section = _setup_cfg_section(setup_cfg)
        if section is not None:
            found.append((f"{setup_cfg} [ddpwatch]", section))
    pyproject = os.path.join(cwd, "pyproject.toml")
    if os.path.isfile(pyproject):
        section = _pyproject_section(pyproject)
        if section is not None:
            found.append((f"{pyproject} [tool.ddpwatch]", section))
    return found


# No [DEFAULT] section for ddpwatch: with this name as the parser's default section, a file's [DEFAULT]
# (meant for other tools) is an ordinary section whose keys never leak into [ddpwatch].
_NO_DEFAULT_SECTION = "\x00ddpwatch-no-default"

# Whether a file that cannot be parsed holds ddpwatch settings at all: only then is it ddpwatch's problem (an
# unrelated broken pyproject.toml must not stop every Python process started under DDPWATCH=1). Any case, so
# that a broken file with a [DDPWATCH] section is reported too.
_SETUP_CFG_OURS = r"^\s*\[\s*(tool\s*[:.]\s*)?ddpwatch\s*\]"
_PYPROJECT_OURS = (
    r'^\s*\[+\s*"?tool"?\s*\.\s*"?ddpwatch\b'  # [tool.ddpwatch], [tool.ddpwatch.x]
    r'|^\s*"?tool"?\s*\.\s*"?ddpwatch"?\s*[.=]'  # tool.ddpwatch.timeout = 5
    r'|^\s*"?ddpwatch"?\s*(\.|=\s*\{)'
)  # ddpwatch = {...} inside [tool]


def _holds_ddpwatch_settings(text: str, pattern: str) -> bool:
    # Compiled on first use only (re caches it): most processes never meet a broken file.
    return re.search(pattern, text, re.MULTILINE | re.IGNORECASE) is not None


def _read_text(path: str) -> tuple:
    """(text, error): the file as UTF-8, or what it could be read as with the reason it is not valid UTF-8."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:  # mode 0000, say: it may hold ddpwatch's settings, so it cannot be passed over
        raise ConfigError(
            f"ddpwatch: cannot read {path}, where ddpwatch looks for its settings: {exc.strerror or exc}"
        ) from None
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return raw.decode("utf-8", "replace"), exc


def _unreadable(path: str, text: str, ours: str, exc) -> None:
    """A file that cannot be parsed is an error only when it holds ddpwatch settings; otherwise it is not ours."""
    if _holds_ddpwatch_settings(text, ours):
        raise ConfigError(f"ddpwatch: cannot read {path}, which holds ddpwatch settings: {exc}")


def _looks_like_ours(name: str) -> bool:
    """[DDPWATCH], [tool:ddpwatch], [tool.DdpWatch], [ddp-watch]: a section meant for ddpwatch, spelt otherwise."""
    return re.sub(r"[\s_-]", "", name.lower()) in ("ddpwatch", "tool:ddpwatch", "tool.ddpwatch")


def _warn_misnamed_section(path: str, found: str, meant: str) -> None:
    warn_once(
        f"section:{path}:{found}",
        f"ddpwatch: ignoring [{found}] in {path}: section names are case-sensitive; did you mean [{meant}]?",
    )


def _setup_cfg_section(path: str) -> dict | None:
    """setup.cfg's [ddpwatch] as written: no %-interpolation (dir = /scratch/100% is a path), no [DEFAULT] keys."""
    text, undecodable = _read_text(path)
    if undecodable:
        _unreadable(path, text, _SETUP_CFG_OURS, undecodable)
        return None
    import configparser  # here, not at the top: see _toml()

    parser = configparser.ConfigParser(interpolation=None, default_section=_NO_DEFAULT_SECTION)
    try:
        parser.read_string(text, source=path)
    except configparser.Error as exc:
        _unreadable(path, text, _SETUP_CFG_OURS, exc)
        return None
    for name in parser.sections():
        if name != "ddpwatch" and _looks_like_ours(name):
            _warn_misnamed_section(path, name, "ddpwatch")
    return dict(parser.items("ddpwatch")) if parser.has_section("ddpwatch") else None


def _pyproject_section(path: str) -> dict | None:
    """pyproject.toml's [tool.ddpwatch]; needs tomllib (3.11+) or tomli, else fails only when the section exists."""
    text, undecodable = _read_text(path)
    tomllib = _toml()
    if tomllib is None:
        if _holds_ddpwatch_settings(text, _PYPROJECT_OURS):
            raise ConfigError(
                f"ddpwatch: {path} has a [tool.ddpwatch] section, but this Python "
                f"({sys.version.split()[0]}) cannot read TOML: pip install tomli, "
                f"or move the settings to setup.cfg [ddpwatch] or DDPWATCH_* variables"
            )
        return None
    if undecodable:
        _unreadable(path, text, _PYPROJECT_OURS, undecodable)
        return None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        _unreadable(path, text, _PYPROJECT_OURS, exc)
        return None
    _warn_misnamed_tables(path, data)
    tool = data.get("tool")
    section = tool.get("ddpwatch") if isinstance(tool, dict) else None
    return section if isinstance(section, dict) else None


def _warn_misnamed_tables(path: str, data: dict) -> None:
    """[DDPWATCH], [ddpwatch] at the top level, [tool.DDPWATCH], [Tool.ddpwatch]: all ignored, so say so."""
    for key, value in data.items():
        if _looks_like_ours(key):
            _warn_misnamed_section(path, key, "tool.ddpwatch")
        elif key.lower() == "tool" and isinstance(value, dict):
            for name in value:
                if _looks_like_ours(name) and (key, name) != ("tool", "ddpwatch"):
                    _warn_misnamed_section(path, f"{key}.{name}", "tool.ddpwatch")
