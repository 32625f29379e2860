"""All of ddpwatch's configuration: one table of options, one precedence order, one place that reads the environment."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping, NamedTuple

from .config_files import ConfigError, did_you_mean, file_settings, warn_once


class Action(NamedTuple):
    """What a rank does once a verdict is out: one row here and one `@abort.policy(name)` function in
    watch/abort.py (docs/contributing.md, "Add an abort policy")."""

    name: str
    ends_rank: bool  # the verdict ends the ranks: torchrun's error file is written first, peers act on it too
    does: str  # what it does, in the words of the `action` option's help


REPORT, ABORT = "report", "abort"
# The one table of actions; its first row is what a report nobody asked to act on gets (a dump, a peer's failure).
ACTIONS = (
    Action(REPORT, False, "keep waiting"),
    Action(ABORT, True, "end every rank with a non-zero exit"),
)


def action_row(name: str) -> Action:
    """The row of action `name` (read at call time: a test may add a row)."""
    return next(row for row in ACTIONS if row.name == name)


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


# Upper bounds: a value past them is a slip (a missing unit, 10**13), and some would break the watchdog (a lock's
# timeout past threading.TIMEOUT_MAX raises; a ring of 10**13 records grows until memory runs out).
DAY_S = 86400.0
MAX_SECONDS = {"timeout": 30 * DAY_S, "grace": 3600.0, "interval": 60.0, "dead_after": DAY_S}
MAX_RING_SIZE = 1_000_000  # records of about 0.3 KiB: at most a few hundred MB, where the default 2048 is 0.6 MB


def _seconds(name: str) -> Callable[[str], float]:
    """The parser of option `name`: a positive number of seconds, at most MAX_SECONDS[name]."""

    def parse(text: str) -> float:
        value = _parse_seconds(text)
        if value > MAX_SECONDS[name]:
            raise ValueError(f"at most {MAX_SECONDS[name]:g} seconds")
        return value

    return parse


def _seconds_accepted(name: str) -> str:
    return f"a positive number of seconds, at most {MAX_SECONDS[name]:g}"


def _parse_ring_size(text: str) -> int:
    value = _parse_positive_int(text)
    if value > MAX_RING_SIZE:
        raise ValueError(f"at most {MAX_RING_SIZE}")
    return value


def _parse_action(text: str) -> str:
    value = text.strip().lower()
    names = [row.name for row in ACTIONS]
    if value not in names:
        raise ValueError("expected one of: " + ", ".join(names))
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


RECORDERS = ("auto", "python", "flight")  # the `recorder` option's values (docs/how-it-works.md#the-two-recorders)
RELAYS = ("auto", "on", "off")  # the `relay` option's values (watch/node.py)


def _one_of(values: tuple):
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in values:
            raise ValueError(f"expected one of {', '.join(values)}")
        return value

    return parse


def _parse_command(text: str) -> str | None:
    """A shell command line; empty means none (a file or variable can switch an inherited one off)."""
    return text.strip() or None


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
    # Besides text: the TOML / Python types this option takes from a file or an argument (a list is never str()ed).
    takes: tuple = ()
    # Whether a guard()/install() argument may be a callable, kept as it is (on_incident); never from text.
    callable_ok: bool = False

    @property
    def env_var(self) -> str:
        return "DDPWATCH" if self.name == "enabled" else "DDPWATCH_" + self.name.upper()


# The one table of options. docs/configuration.md documents each row; a test checks that it does.
OPTIONS = (
    Option(
        "enabled",
        False,
        _parse_bool,
        "1/0, true/false, yes/no, on/off",
        "Install the guard in every Python process that starts (zero-code activation).",
        (bool, int),
    ),
    Option("dir", "./ddpwatch-reports", str, "a directory path", "Where incident folders are written.", (os.PathLike,)),
    Option(
        "timeout",
        300.0,
        _seconds("timeout"),
        _seconds_accepted("timeout"),
        "How long a rank may wait in a collective, while a peer is busy elsewhere, before a straggler is reported.",
        (int, float),
    ),
    Option(
        "action",
        REPORT,
        _parse_action,
        " or ".join(row.name for row in ACTIONS),
        "What to do after a report: " + " or ".join(f"{row.does} ({row.name})" for row in ACTIONS) + ".",
    ),
    Option(
        "grace",
        0.5,
        _seconds("grace"),
        _seconds_accepted("grace"),
        "How long every rank must be blocked with no progress before a deadlock counts as proven.",
        (int, float),
    ),
    Option(
        "interval",
        1.0,
        _seconds("interval"),
        _seconds_accepted("interval"),
        "How often each rank publishes its state and looks at its peers.",
        (int, float),
    ),
    Option(
        "dead_after",
        10.0,
        _seconds("dead_after"),
        _seconds_accepted("dead_after"),
        "How long a peer's heartbeat may stay still before it is taken for dead or unresponsive.",
        (int, float),
    ),
    Option(
        "ring_size",
        2048,
        _parse_ring_size,
        f"a positive integer, at most {MAX_RING_SIZE}",
        "How many collective records each rank keeps (a bounded ring buffer).",
        (int,),
    ),
    Option(
        "exit_code",
        3,
        _parse_exit_code,
        "an integer from 1 to 255",
        "The exit status of a rank ended by action=abort.",
        (int,),
    ),
    Option(
        "lint_ignore",
        (),
        _parse_codes,
        "comma-separated lint codes, e.g. DDP004",
        "Lint checks to turn off by default.",
        (list, tuple),
    ),
    Option(
        "user_packages",
        (),
        _parse_packages,
        "comma-separated top-level package names, e.g. mylab",
        "Installed packages whose frames are your own code: the report may name their lines as yours.",
        (list, tuple),
    ),
    Option(
        "library_packages",
        (),
        _parse_packages,
        "comma-separated top-level package names, e.g. trainkit",
        "Packages (installed or not) whose frames are library code, never named as your line. Every package "
        "installed in site-packages other than those in user_packages already is.",
        (list, tuple),
    ),
    Option(
        "recorder",
        "auto",
        _one_of(RECORDERS),
        ", ".join(RECORDERS),
        "Where each rank's sequence of collectives comes from: python (a wrapper on every collective), flight "
        "(torch's own Flight Recorder, read by the watchdog when a rank stops making progress and once a round "
        "while it makes some: no record per collective; gloo only, else python) or auto (python; why: "
        "docs/how-it-works.md, the two recorders).",
    ),
    Option(
        "signals",
        True,
        _parse_bool,
        "1/0, true/false, yes/no, on/off",
        "While armed, SIGUSR1 asks for a report now (`ddpwatch dump`) and SIGTERM lets a report being written "
        "finish (at most 3 s) before the process ends as it would have.",
        (bool, int),
    ),
    Option(
        "native_stacks",
        True,
        _parse_bool,
        "1/0, true/false, yes/no, on/off",
        "Read each rank's native (C/C++) stacks with py-spy once the report is written, into the incident's "
        "native.json (py-spy pauses the process it reads while it reads it); off: Python stacks only.",
        (bool, int),
    ),
    Option(
        "relay",
        "auto",
        _one_of(RELAYS),
        ", ".join(RELAYS),
        "Whether a node's running ranks reach the store through one of them (the node relay: one round trip a "
        "node, not a rank, while nothing is wrong): auto where the job spans nodes under torchrun, on, or off.",
    ),
    Option(
        "on_incident",
        None,
        _parse_command,
        "a shell command line (guard()/install(): also a callable)",
        "Run once per incident by the rank that writes the report, with the report's folder and a one-line "
        "summary in its environment (DDPWATCH_INCIDENT_DIR, DDPWATCH_INCIDENT_SUMMARY); killed after 30 s, "
        "its failure logged, never raised.",
        callable_ok=True,
    ),
)
# What the on_incident command finds in its environment: set by ddpwatch for the hook, not options to warn about.
INCIDENT_VARIABLES = (
    "DDPWATCH_INCIDENT_DIR",
    "DDPWATCH_INCIDENT_SUMMARY",
    "DDPWATCH_INCIDENT_KIND",
    "DDPWATCH_INCIDENT_CULPRITS",
)
ON_INCIDENT_TIMEOUT_S = 30.0  # the longest an on_incident hook may run before it is killed (a command) or left
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}
DEFAULTS = {option.name: option.default for option in OPTIONS}  # each default is written once, in OPTIONS


@dataclasses.dataclass(frozen=True)
class Config:
    enabled: bool = DEFAULTS["enabled"]
    dir: str = DEFAULTS["dir"]
    timeout: float = DEFAULTS["timeout"]
    action: str = DEFAULTS["action"]
    grace: float = DEFAULTS["grace"]
    interval: float = DEFAULTS["interval"]
    dead_after: float = DEFAULTS["dead_after"]
    ring_size: int = DEFAULTS["ring_size"]
    exit_code: int = DEFAULTS["exit_code"]
    lint_ignore: tuple = DEFAULTS["lint_ignore"]
    user_packages: tuple = DEFAULTS["user_packages"]
    library_packages: tuple = DEFAULTS["library_packages"]
    signals: bool = DEFAULTS["signals"]
    recorder: str = DEFAULTS["recorder"]
    native_stacks: bool = DEFAULTS["native_stacks"]
    relay: str = DEFAULTS["relay"]
    on_incident: Any = DEFAULTS["on_incident"]
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)


def _coerce(option: Option, raw: Any, source: str) -> Any:
    """Parse one raw value, or raise a ConfigError naming the option, the value, its source and what is accepted."""
    if option.callable_ok and callable(raw) and source.startswith("argument"):
        return raw  # a function handed to guard(): called as it is
    text = _as_text(option, raw, source)
    if isinstance(text, bool):
        return text
    try:
        return option.parse(text)
    except (TypeError, ValueError):
        raise ConfigError(
            f"ddpwatch: bad value {text!r} for {option.name} (from {source}): accepted: {option.accepted}"
        ) from None


def _as_text(option: Option, raw: Any, source: str) -> Any:
    """The raw value as text for option.parse (a bool stays a bool for a yes/no option); a value of a type the
    option does not take (a TOML list where one path is expected, true where seconds are) is a ConfigError."""
    if isinstance(raw, str):
        return raw
    takes = tuple(kind for kind in option.takes if kind is not bool)
    if isinstance(raw, bool):
        if bool in option.takes:
            return raw
    elif isinstance(raw, (list, tuple)) and list in option.takes:
        if all(isinstance(item, str) for item in raw):
            return ",".join(raw)
    elif takes and isinstance(raw, takes):
        return os.fspath(raw) if isinstance(raw, os.PathLike) else str(raw)
    raise ConfigError(
        f"ddpwatch: bad value {raw!r} for {option.name} (from {source}): "
        f"a {type(raw).__name__} is not accepted here; accepted: {option.accepted}"
    )


# ---------------------------------------------------------------- bounds that involve more than one value

MIN_INTERVAL_S = 0.05


class Bound(NamedTuple):  # a NamedTuple, not a dataclass: this module is imported at every start under DDPWATCH=1
    """`name` must be at least `factor` x the value of option `basis` (or `factor` seconds without one);
    `why` says what goes wrong below it, and goes into the error."""

    name: str
    factor: float
    basis: str | None
    why: str

    def least(self, values: dict) -> float:
        return self.factor * (values[self.basis] if self.basis else 1.0)

    def describe(self, values: dict, sources: dict) -> str:
        if self.basis is None:
            return f"{self.factor:g} s"
        times = f"{self.factor:g} x " if self.factor != 1 else ""
        return (
            f"{times}{self.basis} = {self.least(values):g} s "
            f"({self.basis} from {_described_source(sources[self.basis])})"
        )


# Checked in this order: each bound rests on a value that an earlier row has already accepted.
BOUNDS = (
    Bound(
        "interval",
        MIN_INTERVAL_S,
        None,
        "each round publishes this rank's state to the store and reads its peers', so shorter rounds take "
        "time from training (an interval of 1e-9 s cost 45% of the throughput)",
    ),
    Bound(
        "grace",
        0.5,
        "interval",
        "every wait longer than grace registers the rank as waiting (a round trip, and a look by the leader) until "
        "its next round, so a grace far below the interval would keep ordinary waits on a slower peer registering",
    ),
    Bound(
        "dead_after",
        3.0,
        "interval",
        "a heartbeat comes once per interval, and one or two late rounds on a loaded machine must not make a "
        "live rank look dead",
    ),
    Bound("timeout", 1.0, "grace", "a straggler would be reported before its wait even counts as blocked"),
)


def _described_source(source: str) -> str:
    """A Config.sources entry as the errors say it: DDPWATCH_GRACE -> environment variable DDPWATCH_GRACE."""
    if source == "argument":
        return "a guard()/install() argument"
    return f"environment variable {source}" if source.startswith("DDPWATCH") else source


def _check_bounds(values: dict, sources: dict) -> None:
    for bound in BOUNDS:
        if values[bound.name] < bound.least(values) * (1 - 1e-9):  # 3 x 0.05 is 0.15000000000000002 in floats
            raise ConfigError(
                f"ddpwatch: {bound.name} = {values[bound.name]:g} s "
                f"(from {_described_source(sources[bound.name])}) is "
                f"too small: the least is {bound.describe(values, sources)}, because {bound.why}"
            )


def _check_dir(path: str, source: str, cwd: str) -> None:
    """dir must be a folder or a path where one can be made: not empty, not a file such as /dev/null."""
    if not path:
        raise ConfigError(f"ddpwatch: bad value '' for dir (from {source}): accepted: a directory path")
    target = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    here = target
    while not os.path.exists(here):  # the nearest existing path above decides whether the folder can be made
        parent = os.path.dirname(here)
        if parent == here:
            return
        here = parent
    if not os.path.isdir(here):
        where = "is" if here == target else "lies under"
        raise ConfigError(
            f"ddpwatch: bad value {path!r} for dir (from {source}): it {where} {here}, which exists "
            f"and is not a directory, so no report folder can be made there; "
            f"accepted: a directory path"
        )


# Names that are right elsewhere: guard's old report_dir= is DDPWATCH_DIR in the environment.
_SPELT_OTHERWISE = {"report_dir": "dir", "reports_dir": "dir"}


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """DDPWATCH_TIMOUT would be ignored silently otherwise: say so, with the nearest real name."""
    known = {option.env_var for option in OPTIONS}
    for name in environ:
        upper = name.upper()
        if name in known or name in INCIDENT_VARIABLES or not (upper == "DDPWATCH" or upper.startswith("DDPWATCH_")):
            continue
        suffix = upper[len("DDPWATCH_") :].lower() if upper != "DDPWATCH" else "enabled"
        nearest = _SPELT_OTHERWISE.get(suffix) or did_you_mean(suffix, OPTIONS_BY_NAME)
        hint = f"did you mean {OPTIONS_BY_NAME[nearest].env_var}?" if nearest else f"known: {', '.join(sorted(known))}"
        warn_once(f"env:{name}", f"ddpwatch: ignoring the environment variable {name}: no such option; {hint}")


def _check_names(names, source: str) -> None:
    unknown = sorted(set(names) - set(OPTIONS_BY_NAME))
    if unknown:
        nearest = did_you_mean(unknown[0], OPTIONS_BY_NAME)
        hint = f" (did you mean {nearest}?)" if nearest else ""
        raise ConfigError(
            f"ddpwatch: unknown option(s) {', '.join(unknown)} in {source}{hint}; known: {', '.join(OPTIONS_BY_NAME)}"
        )


def load(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None, cwd: str | None = None
) -> Config:
    """Build the configuration: defaults, then setup.cfg/pyproject.toml, then DDPWATCH_* variables, then overrides."""
    environ = os.environ if environ is None else environ
    values = {option.name: option.default for option in OPTIONS}
    sources = {option.name: "default" for option in OPTIONS}
    for option, raw, where, source in _settings(environ, cwd or os.getcwd(), check=True):
        values[option.name] = _coerce(option, raw, where)
        sources[option.name] = source
    for name, raw in (overrides or {}).items():
        _check_names([name], "guard() arguments")  # a misspelt name is an error even when its value is None
        if raw is None:
            continue
        values[name] = _coerce(OPTIONS_BY_NAME[name], raw, f"argument {name}=")
        sources[name] = "argument"
    _check_bounds(values, sources)
    _check_dir(values["dir"], _described_source(sources["dir"]), cwd or os.getcwd())
    return Config(**values, sources=sources)


def load_packages(environ: Mapping[str, str] | None = None, cwd: str | None = None) -> tuple:
    """(user_packages, library_packages) as load() would set them (files, then DDPWATCH_* variables), and nothing
    else: an offline reader (`ddpwatch report --flight-recorder`) classes frames as a live run would, and a setting it
    does not use (a report dir that does not exist here) must not stop it. A bad value of these two is a ConfigError."""
    environ = os.environ if environ is None else environ
    values = {name: OPTIONS_BY_NAME[name].default for name in ("user_packages", "library_packages")}
    for option, raw, where, _ in _settings(environ, cwd or os.getcwd(), check=False):
        if option.name in values:
            values[option.name] = _coerce(option, raw, where)
    return values["user_packages"], values["library_packages"]


def _settings(environ: Mapping[str, str], cwd: str, check: bool):
    """(option, raw value, where it was set as an error says it, its Config.sources entry) from setup.cfg /
    pyproject.toml, then DDPWATCH_* variables: later ones win. `check`: an unknown name in a file is a ConfigError
    and an unknown DDPWATCH_* variable a warning (load()); else unknown names are passed over."""
    for source, settings in file_settings(cwd):
        settings = {key.replace("-", "_"): value for key, value in settings.items()}
        if check:
            _check_names(settings, source)
        for name, raw in settings.items():
            if name in OPTIONS_BY_NAME:
                yield OPTIONS_BY_NAME[name], raw, source, source
    if check:
        _warn_unknown_variables(environ)
    for option in OPTIONS:
        raw = environ.get(option.env_var)
        if raw is not None:
            yield option, raw, f"environment variable {option.env_var}", option.env_var


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


def run_tag(environ: Mapping[str, str] | None = None) -> str:
    """The launcher's job id and, under torchrun, the attempt (TORCHELASTIC_RESTART_COUNT): a restarted job is a new
    run, with its own keys in the store (which torchrun's agent keeps from one attempt to the next) and its own
    incident folders, and the previous attempt's report stays where it is."""
    environ = os.environ if environ is None else environ
    job, attempt = job_id(environ), environ.get("TORCHELASTIC_RESTART_COUNT", "")
    if not attempt.isdigit():
        return job
    return f"{job}-attempt{int(attempt)}" if job else f"attempt{int(attempt)}"


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


def incident_hook_environ(values, environ: Mapping[str, str] | None = None) -> dict:
    """The environment of the on_incident command: this rank's, less ddpwatch's own settings (the hook is not a
    rank to guard), plus `values` in INCIDENT_VARIABLES' order (folder, summary, kind, culprits)."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if k not in _OPTION_VARIABLES}
    env.update(zip(INCIDENT_VARIABLES, values))
    return env


_OPTION_VARIABLES = frozenset(option.env_var for option in OPTIONS)
