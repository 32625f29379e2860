"""All of ddpwatch's configuration: one table of options, one precedence order, one place that reads the environment."""

from __future__ import annotations

import configparser
import dataclasses
import os
import re
import sys
from typing import Any, Callable, Mapping

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11: the same parser, published as tomli
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None


class ConfigError(ValueError):
    """A configuration value that ddpwatch cannot accept; raised before training starts, never mid-run."""


ACTIONS = ("report", "abort")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def _parse_seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError("expected a positive number of seconds")
    return value


def _parse_action(text: str) -> str:
    value = text.strip().lower()
    if value not in ACTIONS:
        raise ValueError("expected one of: " + ", ".join(ACTIONS))
    return value


def _parse_positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("expected a positive integer")
    return value


def _parse_exit_code(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 255:
        raise ValueError("expected an integer from 1 to 255")
    return value


def _parse_codes(text: str) -> tuple:
    return tuple(code.strip().upper() for code in str(text).split(",") if code.strip())


def _parse_packages(text: str) -> tuple:
    names = tuple(name.strip() for name in str(text).split(",") if name.strip())
    bad = [name for name in names if not name.isidentifier()]
    if bad:
        raise ValueError(f"not a top-level package name: {', '.join(bad)}")
    return names


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    default: Any
    parse: Callable[[str], Any]
    accepted: str
    help: str

    @property
    def env_var(self) -> str:
        return "DDPWATCH" if self.name == "enabled" else "DDPWATCH_" + self.name.upper()


# The one table of options. docs/configuration.md documents each row; a test checks that it does.
OPTIONS = (
    Option("enabled", False, _parse_bool, "1/0, true/false, yes/no, on/off",
           "Install the guard in every Python process that starts (zero-code activation)."),
    Option("dir", "./ddpwatch-reports", str, "a directory path",
           "Where incident folders are written."),
    Option("timeout", 300.0, _parse_seconds, "a positive number of seconds",
           "How long a rank may wait in a collective, while a peer is busy elsewhere, before a straggler is reported."),
    Option("action", "report", _parse_action, "report or abort",
           "What to do after a report: keep waiting (report) or end every rank with a non-zero exit (abort)."),
    Option("grace", 2.0, _parse_seconds, "a positive number of seconds",
           "How long every rank must be blocked with no progress before a deadlock counts as proven."),
    Option("interval", 0.5, _parse_seconds, "a positive number of seconds",
           "How often each rank publishes its state and looks at its peers."),
    Option("dead_after", 10.0, _parse_seconds, "a positive number of seconds",
           "How long a peer's heartbeat may stay still before it is taken for dead or unresponsive."),
    Option("ring_size", 2048, _parse_positive_int, "a positive integer",
           "How many collective records each rank keeps (a bounded ring buffer)."),
    Option("exit_code", 3, _parse_exit_code, "an integer from 1 to 255",
           "The exit status of a rank ended by action=abort."),
    Option("lint_ignore", (), _parse_codes, "comma-separated lint codes, e.g. DDP004",
           "Lint checks to turn off by default."),
    Option("user_packages", (), _parse_packages, "comma-separated top-level package names, e.g. mylab",
           "Installed packages whose frames are your own code: the report may name their lines as yours."),
    Option("library_packages", (), _parse_packages, "comma-separated top-level package names, e.g. trainkit",
           "Packages (installed or not) whose frames are library code, never named as your line. Every package "
           "installed in site-packages other than those in user_packages already is."),
    Option("signals", True, _parse_bool, "1/0, true/false, yes/no, on/off",
           "While armed, SIGUSR1 asks for a report now (`ddpwatch dump`) and SIGTERM lets a report being written "
           "finish (at most 3 s) before the process ends as it would have."),
)
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}


@dataclasses.dataclass(frozen=True)
class Config:
    enabled: bool = False
    dir: str = "./ddpwatch-reports"
    timeout: float = 300.0
    action: str = "report"
    grace: float = 2.0
    interval: float = 0.5
    dead_after: float = 10.0
    ring_size: int = 2048
    exit_code: int = 3
    lint_ignore: tuple = ()
    user_packages: tuple = ()
    library_packages: tuple = ()
    signals: bool = True
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)


def _coerce(option: Option, raw: Any, source: str) -> Any:
    """Parse one raw value, or raise a ConfigError naming the option, the value, where it came from and what is accepted."""
    if not isinstance(raw, str):
        if option.parse in (_parse_codes, _parse_packages) and isinstance(raw, (list, tuple)):
            raw = ",".join(str(item) for item in raw)
        elif isinstance(raw, bool) and option.parse is _parse_bool:
            return raw
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            raw = str(raw)
        else:
            raw = str(raw)
    try:
        return option.parse(raw)
    except (TypeError, ValueError):
        raise ConfigError(
            f"ddpwatch: bad value {raw!r} for {option.name} (from {source}): accepted: {option.accepted}"
        ) from None


def _file_settings(cwd: str) -> list:
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


def _setup_cfg_section(path: str) -> dict | None:
    """setup.cfg's [ddpwatch] as written: no %-interpolation (dir = /scratch/100% is a path), no [DEFAULT] keys."""
    parser = configparser.ConfigParser(interpolation=None, default_section=_NO_DEFAULT_SECTION)
    try:
        parser.read(path, encoding="utf-8")
        if not parser.has_section("ddpwatch"):
            return None
        return dict(parser.items("ddpwatch"))
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"ddpwatch: cannot read {path}: {exc}") from None


_TOOL_DDPWATCH = re.compile(r"^\s*\[\s*tool\s*\.\s*ddpwatch\s*[\].]", re.MULTILINE)


def _pyproject_section(path: str) -> dict | None:
    """pyproject.toml's [tool.ddpwatch]; needs tomllib (3.11+) or tomli, else fails only when the section exists."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ConfigError(f"ddpwatch: cannot read {path}: {exc}") from None
    if tomllib is None:
        if _TOOL_DDPWATCH.search(raw.decode("utf-8", "replace")):
            raise ConfigError(f"ddpwatch: {path} has a [tool.ddpwatch] section, but this Python "
                              f"({sys.version.split()[0]}) cannot read TOML: pip install tomli, "
                              f"or move the settings to setup.cfg [ddpwatch] or DDPWATCH_* variables")
        return None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"ddpwatch: cannot read {path}: {exc}") from None
    tool = data.get("tool")
    section = tool.get("ddpwatch") if isinstance(tool, dict) else None
    return section if isinstance(section, dict) else None


def _check_names(names, source: str) -> None:
    unknown = sorted(set(names) - set(OPTIONS_BY_NAME))
    if unknown:
        raise ConfigError(
            f"ddpwatch: unknown option(s) {', '.join(unknown)} in {source}; known: {', '.join(OPTIONS_BY_NAME)}"
        )


def load(overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None,
         cwd: str | None = None) -> Config:
    """Build the configuration: defaults, then setup.cfg/pyproject.toml, then DDPWATCH_* variables, then overrides."""
    environ = os.environ if environ is None else environ
    values = {option.name: option.default for option in OPTIONS}
    sources = {option.name: "default" for option in OPTIONS}
    for source, settings in _file_settings(cwd or os.getcwd()):
        settings = {key.replace("-", "_"): value for key, value in settings.items()}
        _check_names(settings, source)
        for name, raw in settings.items():
            values[name] = _coerce(OPTIONS_BY_NAME[name], raw, source)
            sources[name] = source
    for option in OPTIONS:
        raw = environ.get(option.env_var)
        if raw is not None:
            values[option.name] = _coerce(option, raw, f"environment variable {option.env_var}")
            sources[option.name] = option.env_var
    for name, raw in (overrides or {}).items():
        _check_names([name], "guard() arguments")  # a misspelt name is an error even when its value is None
        if raw is None:
            continue
        values[name] = _coerce(OPTIONS_BY_NAME[name], raw, f"argument {name}=")
        sources[name] = "argument"
    return Config(**values, sources=sources)


def is_enabled_in(environ: Mapping[str, str] | None = None) -> bool:
    """Whether DDPWATCH asks for zero-code activation; a bad value raises the same ConfigError as load()."""
    environ = os.environ if environ is None else environ
    raw = environ.get("DDPWATCH")
    return False if raw is None else _coerce(OPTIONS_BY_NAME["enabled"], raw, "environment variable DDPWATCH")


def job_id(environ: Mapping[str, str] | None = None) -> str:
    """The launcher's name for this job (torchrun's TORCHELASTIC_RUN_ID, a scheduler's job id), or ''."""
    environ = os.environ if environ is None else environ
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "JOB_ID"):
        value = environ.get(name, "")
        if value and value.lower() != "none":
            return value
    return ""


def torchelastic_error_file(environ: Mapping[str, str] | None = None) -> str:
    """Where torchrun's agent reads a worker's failure reason (TORCHELASTIC_ERROR_FILE), or ''."""
    environ = os.environ if environ is None else environ
    return environ.get("TORCHELASTIC_ERROR_FILE", "")


def rendezvous_address(environ: Mapping[str, str] | None = None) -> str:
    """MASTER_ADDR:MASTER_PORT of this rank's job ('' without them): tells two local jobs apart in `ddpwatch dump`."""
    environ = os.environ if environ is None else environ
    addr, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
    return f"{addr}:{port}" if addr or port else ""


def activation_environ(bootstrap_dir: str, environ: Mapping[str, str] | None = None) -> dict:
    """The environment `ddpwatch run` gives its command: DDPWATCH=1 and bootstrap_dir first on PYTHONPATH."""
    env = dict(os.environ if environ is None else environ)
    env["DDPWATCH"] = "1"
    rest = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != bootstrap_dir]
    env["PYTHONPATH"] = os.pathsep.join([bootstrap_dir] + rest)
    return env
