"""config.load(): defaults, precedence, validation. Always an explicit environ and cwd: os.environ is never read."""

import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from ddpwatch import config  # noqa: E402
from ddpwatch.config import Config, ConfigError, load  # noqa: E402


def write(folder, name, text):
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults(tmp_path):
    cfg = load(environ={}, cwd=str(tmp_path))
    assert cfg == Config()
    assert (
        cfg.enabled,
        cfg.dir,
        cfg.timeout,
        cfg.action,
        cfg.grace,
        cfg.interval,
        cfg.dead_after,
        cfg.ring_size,
        cfg.exit_code,
        cfg.lint_ignore,
    ) == (False, "./ddpwatch-reports", 300.0, "report", 0.5, 1.0, 10.0, 2048, 3, ())
    assert set(cfg.sources.values()) == {"default"}
    assert set(cfg.sources) == set(config.OPTIONS_BY_NAME)


def test_option_table_matches_the_config_class():
    fields = {f.name: f.default for f in dataclasses.fields(Config) if f.name != "sources"}
    assert fields == {option.name: option.default for option in config.OPTIONS}
    assert config.OPTIONS_BY_NAME["enabled"].env_var == "DDPWATCH"
    assert config.OPTIONS_BY_NAME["ring_size"].env_var == "DDPWATCH_RING_SIZE"


def test_config_is_frozen(tmp_path):
    cfg = load(environ={}, cwd=str(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.timeout = 1.0


def test_precedence(tmp_path):
    setup_cfg = write(
        tmp_path,
        "setup.cfg",
        "[metadata]\nname = x\n\n[ddpwatch]\ntimeout = 10\ngrace = 3\ninterval = 1\ndead-after = 20\n",
    )
    pyproject = write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\ntimeout = 20\ngrace = 4\ninterval = 1.5\n")
    environ = {"DDPWATCH_TIMEOUT": "30", "DDPWATCH_GRACE": "5", "PATH": "/bin"}
    cfg = load(overrides={"timeout": 40, "action": None}, environ=environ, cwd=str(tmp_path))
    assert cfg.timeout == 40.0
    assert cfg.grace == 5.0
    assert cfg.interval == 1.5
    assert cfg.dead_after == 20.0
    assert cfg.ring_size == 2048
    assert cfg.action == "report"  # an override of None means "not given"
    assert cfg.sources["timeout"] == "argument"
    assert cfg.sources["grace"] == "DDPWATCH_GRACE"
    assert cfg.sources["interval"] == f"{pyproject} [tool.ddpwatch]"
    assert cfg.sources["dead_after"] == f"{setup_cfg} [ddpwatch]"
    assert cfg.sources["ring_size"] == "default"
    assert cfg.sources["action"] == "default"


@pytest.mark.parametrize(
    "layers, expected",
    [
        ((), 300.0),
        (("cfg",), 10.0),
        (("cfg", "toml"), 20.0),
        (("cfg", "toml", "env"), 30.0),
        (("cfg", "toml", "env", "arg"), 40.0),
        (("toml",), 20.0),
        (("env",), 30.0),
        (("cfg", "arg"), 40.0),
    ],
)
def test_precedence_layer_by_layer(tmp_path, layers, expected):
    if "cfg" in layers:
        write(tmp_path, "setup.cfg", "[ddpwatch]\ntimeout = 10\n")
    if "toml" in layers:
        write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\ntimeout = 20\n")
    environ = {"DDPWATCH_TIMEOUT": "30"} if "env" in layers else {}
    overrides = {"timeout": "40"} if "arg" in layers else {}
    assert load(overrides, environ=environ, cwd=str(tmp_path)).timeout == expected


def test_file_values_of_every_type(tmp_path):
    write(
        tmp_path,
        "pyproject.toml",
        "[tool.ddpwatch]\nenabled = true\nring-size = 64\nexit_code = 7\n"
        'lint_ignore = ["ddp004", "DDP001"]\naction = "ABORT"\ndir = "/scratch/r"\n',
    )
    cfg = load(environ={}, cwd=str(tmp_path))
    assert (cfg.enabled, cfg.ring_size, cfg.exit_code, cfg.lint_ignore, cfg.action, cfg.dir) == (
        True,
        64,
        7,
        ("DDP004", "DDP001"),
        "abort",
        "/scratch/r",
    )


def test_setup_cfg_values_are_parsed(tmp_path):
    write(tmp_path, "setup.cfg", "[ddpwatch]\nenabled = yes\nring_size = 16\nlint_ignore = DDP004, ddp002\n")
    cfg = load(environ={}, cwd=str(tmp_path))
    assert (cfg.enabled, cfg.ring_size, cfg.lint_ignore) == (True, 16, ("DDP004", "DDP002"))


def test_files_without_a_ddpwatch_section_are_ignored(tmp_path):
    write(tmp_path, "setup.cfg", "[metadata]\nname = x\n[tool:pytest]\ntimeout = 5\n")
    write(tmp_path, "pyproject.toml", "[tool.black]\nline-length = 100\n")
    assert load(environ={}, cwd=str(tmp_path)) == Config()


def test_environment_variables(tmp_path):
    environ = {
        "DDPWATCH": "on",
        "DDPWATCH_ACTION": " Abort ",
        "DDPWATCH_EXIT_CODE": "255",
        "DDPWATCH_RING_SIZE": "8",
        "DDPWATCH_DIR": "/r",
        "DDPWATCH_LINT_IGNORE": "ddp001,,DDP002 ",
    }
    cfg = load(environ=environ, cwd=str(tmp_path))
    assert (cfg.enabled, cfg.action, cfg.exit_code, cfg.ring_size, cfg.dir, cfg.lint_ignore) == (
        True,
        "abort",
        255,
        8,
        "/r",
        ("DDP001", "DDP002"),
    )
    assert cfg.sources["enabled"] == "DDPWATCH"


@pytest.mark.parametrize(
    "var, value, option, accepted",
    [
        ("DDPWATCH_ACTION", "explode", "action", "report or abort"),
        ("DDPWATCH_TIMEOUT", "-1", "timeout", "a positive number of seconds, at most 2.592e+06"),
        ("DDPWATCH_TIMEOUT", "abc", "timeout", "a positive number of seconds, at most 2.592e+06"),
        ("DDPWATCH_TIMEOUT", "0", "timeout", "a positive number of seconds, at most 2.592e+06"),
        ("DDPWATCH_GRACE", "nan", "grace", "a positive number of seconds, at most 3600"),
        ("DDPWATCH_INTERVAL", "inf", "interval", "a positive number of seconds, at most 60"),
        ("DDPWATCH", "maybe", "enabled", "1/0, true/false, yes/no, on/off"),
        ("DDPWATCH_RING_SIZE", "0", "ring_size", "a positive integer, at most 1000000"),
        ("DDPWATCH_RING_SIZE", "2.5", "ring_size", "a positive integer, at most 1000000"),
        # issue 27: no upper bound before; 10**13 records grow until memory runs out, 1e300 s broke the loop's sleep
        ("DDPWATCH_RING_SIZE", str(10**13), "ring_size", "a positive integer, at most 1000000"),
        ("DDPWATCH_TIMEOUT", "1e300", "timeout", "a positive number of seconds, at most 2.592e+06"),
        ("DDPWATCH_INTERVAL", "61", "interval", "a positive number of seconds, at most 60"),
        ("DDPWATCH_GRACE", "3601", "grace", "a positive number of seconds, at most 3600"),
        ("DDPWATCH_DEAD_AFTER", "1e10", "dead_after", "a positive number of seconds, at most 86400"),
        ("DDPWATCH_EXIT_CODE", "256", "exit_code", "an integer from 1 to 255"),
        ("DDPWATCH_EXIT_CODE", "0", "exit_code", "an integer from 1 to 255"),
    ],
)
def test_bad_environment_values_raise_config_error(tmp_path, var, value, option, accepted):
    with pytest.raises(ConfigError) as info:
        load(environ={var: value}, cwd=str(tmp_path))
    message = str(info.value)
    assert f"for {option} " in message
    assert repr(value) in message
    assert f"environment variable {var}" in message
    assert message.endswith(f"accepted: {accepted}")


def test_bad_value_in_a_file_names_the_file(tmp_path):
    pyproject = write(tmp_path, "pyproject.toml", '[tool.ddpwatch]\ntimeout = "soon"\n')
    with pytest.raises(ConfigError) as info:
        load(environ={}, cwd=str(tmp_path))
    assert "'soon'" in str(info.value) and "timeout" in str(info.value) and pyproject in str(info.value)


def test_a_toml_boolean_is_not_a_number(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\ntimeout = true\n")
    with pytest.raises(ConfigError, match="timeout"):
        load(environ={}, cwd=str(tmp_path))


@pytest.mark.parametrize(
    "overrides, option",
    [
        ({"action": "explode"}, "action"),
        ({"timeout": True}, "timeout"),
        ({"timeout": -5}, "timeout"),
        ({"ring_size": 1.5}, "ring_size"),
        ({"enabled": "maybe"}, "enabled"),
    ],
)
def test_bad_overrides_raise_config_error(tmp_path, overrides, option):
    with pytest.raises(ConfigError, match=f"for {option} .*argument {option}="):
        load(overrides, environ={}, cwd=str(tmp_path))


def test_unknown_option_in_setup_cfg(tmp_path):
    setup_cfg = write(tmp_path, "setup.cfg", "[ddpwatch]\ntimout = 5\n")
    with pytest.raises(ConfigError) as info:
        load(environ={}, cwd=str(tmp_path))
    assert "timout" in str(info.value) and setup_cfg in str(info.value) and "timeout" in str(info.value)


def test_unknown_option_in_pyproject(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\nverbose = true\n")
    with pytest.raises(ConfigError, match="unknown option.*verbose"):
        load(environ={}, cwd=str(tmp_path))


def test_unknown_override(tmp_path):
    with pytest.raises(ConfigError, match="unknown option.*timout.*guard"):
        load({"timout": 5}, environ={}, cwd=str(tmp_path))


def test_unreadable_files_raise_config_error(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.ddpwatch\ntimeout = 5\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load(environ={}, cwd=str(tmp_path))
    os.remove(tmp_path / "pyproject.toml")
    write(tmp_path, "setup.cfg", "timeout = 5\n[ddpwatch]\ngrace = 3\n")  # no header above the first line
    with pytest.raises(ConfigError, match="cannot read"):
        load(environ={}, cwd=str(tmp_path))


def test_unrelated_environment_is_ignored(tmp_path):
    assert load(environ={"DDPWATCHX": "1", "DDPWATCH_UNKNOWN": "x", "TIMEOUT": "1"}, cwd=str(tmp_path)) == Config()


# ----- bounds between values, with the reason in the error (issue 13 point 7) -----


@pytest.mark.parametrize(
    "environ, option, least, reason",
    [
        ({"DDPWATCH_INTERVAL": "1e-9"}, "interval", "the least is 0.05 s", "throughput"),
        ({"DDPWATCH_INTERVAL": "0.049"}, "interval", "the least is 0.05 s", "throughput"),
        (
            {"DDPWATCH_GRACE": "1e-300"},
            "grace",
            "the least is 0.5 x interval = 0.5 s (interval from default)",
            "keep ordinary waits",
        ),
        (
            {"DDPWATCH_INTERVAL": "5"},
            "grace",
            "the least is 0.5 x interval = 2.5 s (interval from environment variable DDPWATCH_INTERVAL)",
            "keep ordinary waits",
        ),
        ({"DDPWATCH_DEAD_AFTER": "0.001"}, "dead_after", "the least is 3 x interval = 3 s", "look dead"),
        (
            {"DDPWATCH_INTERVAL": "1", "DDPWATCH_GRACE": "1", "DDPWATCH_DEAD_AFTER": "2.9"},
            "dead_after",
            "3 x interval = 3 s",
            "look dead",
        ),
        ({"DDPWATCH_TIMEOUT": "0.4"}, "timeout", "the least is grace = 0.5 s (grace from default)", "before its wait"),
    ],
)
def test_values_below_their_bound_are_errors_that_say_why(tmp_path, environ, option, least, reason):
    with pytest.raises(ConfigError) as info:
        load(environ=environ, cwd=str(tmp_path))
    message = str(info.value)
    assert message.startswith(f"ddpwatch: {option} = ") and "is too small" in message, message
    assert least in message and reason in message, message


def test_a_bound_in_a_file_names_the_file(tmp_path):
    setup_cfg = write(tmp_path, "setup.cfg", "[ddpwatch]\ngrace = 3\ntimeout = 2.5\n")
    with pytest.raises(ConfigError) as info:
        load(environ={}, cwd=str(tmp_path))
    assert f"timeout = 2.5 s (from {setup_cfg} [ddpwatch])" in str(info.value)
    assert f"grace = 3 s (grace from {setup_cfg} [ddpwatch])" in str(info.value)


def test_values_exactly_at_their_bounds_are_accepted(tmp_path):
    cfg = load({"interval": 0.05, "grace": 0.05, "dead_after": 0.15, "timeout": 0.05}, environ={}, cwd=str(tmp_path))
    assert (cfg.interval, cfg.grace, cfg.dead_after, cfg.timeout) == (0.05, 0.05, 0.15, 0.05)


def test_values_exactly_at_their_upper_bounds_are_accepted(tmp_path):
    cfg = load(
        {"interval": 60, "grace": 3600, "dead_after": 86400, "timeout": 30 * 86400, "ring_size": 10**6},
        environ={},
        cwd=str(tmp_path),
    )
    assert (cfg.interval, cfg.grace, cfg.dead_after, cfg.timeout, cfg.ring_size) == (60, 3600, 86400, 2592000, 10**6)


def test_an_argument_below_its_bound_says_it_came_from_an_argument(tmp_path):
    with pytest.raises(ConfigError, match=r"interval = 0.01 s \(from a guard\(\)/install\(\) argument\)"):
        load({"interval": 0.01}, environ={}, cwd=str(tmp_path))


# ----- dir must be a folder, or a path where one can be made -----


def test_dir_that_is_an_existing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(environ={"DDPWATCH_DIR": "/dev/null"}, cwd=str(tmp_path))
    assert str(info.value).startswith(
        "ddpwatch: bad value '/dev/null' for dir (from environment variable "
        "DDPWATCH_DIR): it is /dev/null, which exists and is not a directory"
    )


def test_dir_under_a_file_is_an_error_and_a_relative_dir_is_read_from_cwd(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=f"lies under {tmp_path / 'notes.txt'}, which exists and is not a dir"):
        load(environ={"DDPWATCH_DIR": "notes.txt/reports"}, cwd=str(tmp_path))


@pytest.mark.parametrize("value", ["new/deeper/reports", ".", "~/somewhere-new", "/tmp"])
def test_dir_that_exists_or_can_be_made_is_accepted(tmp_path, value):
    assert load(environ={"DDPWATCH_DIR": value}, cwd=str(tmp_path)).dir == value


def test_empty_dir_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="bad value '' for dir"):
        load(environ={"DDPWATCH_DIR": ""}, cwd=str(tmp_path))


# ----- TOML values of the wrong type are errors, never str()ed -----


@pytest.mark.parametrize(
    "line, option, kind",
    [
        ('dir = ["/a", "/b"]', "dir", "list"),
        ('action = ["abort"]', "action", "list"),
        ("timeout = [600]", "timeout", "list"),
        ("dir = { path = '/a' }", "dir", "dict"),
        ("dir = 5", "dir", "int"),
        ("dir = true", "dir", "bool"),
        ("ring_size = 2.0", "ring_size", "float"),
        ("lint_ignore = [4, 2]", "lint_ignore", "list"),
        ("signals = [true]", "signals", "list"),
    ],
)
def test_toml_values_of_a_type_the_option_does_not_take_are_errors(tmp_path, line, option, kind):
    pyproject = write(tmp_path, "pyproject.toml", f"[tool.ddpwatch]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load(environ={}, cwd=str(tmp_path))
    message = str(info.value)
    assert f" for {option} (from {pyproject} [tool.ddpwatch]): a {kind} is not accepted here; accepted: " in message


def test_toml_values_of_the_types_each_option_takes(tmp_path):
    write(
        tmp_path,
        "pyproject.toml",
        "[tool.ddpwatch]\nenabled = 1\nsignals = false\ntimeout = 600\n"
        "grace = 2.5\nring_size = 16\nlint_ignore = ['DDP004']\n",
    )
    cfg = load(environ={}, cwd=str(tmp_path))
    assert (cfg.enabled, cfg.signals, cfg.timeout, cfg.grace, cfg.ring_size, cfg.lint_ignore) == (
        True,
        False,
        600.0,
        2.5,
        16,
        ("DDP004",),
    )


def test_a_path_object_is_a_dir(tmp_path):
    assert load({"dir": tmp_path / "reports"}, environ={}, cwd=str(tmp_path)).dir == str(tmp_path / "reports")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_is_enabled_in():
    assert config.is_enabled_in({}) is False
    assert config.is_enabled_in({"DDPWATCH": "1"}) is True
    assert config.is_enabled_in({"DDPWATCH": "off"}) is False
    with pytest.raises(ConfigError, match="'maybe'"):
        config.is_enabled_in({"DDPWATCH": "maybe"})


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, ""),
        ({"TORCHELASTIC_RUN_ID": "abc123"}, "abc123"),
        ({"TORCHELASTIC_RUN_ID": "none"}, ""),
        ({"TORCHELASTIC_RUN_ID": "None", "SLURM_JOB_ID": "4242"}, "4242"),
        ({"TORCHELASTIC_RUN_ID": "", "JOB_ID": "j9"}, "j9"),
        ({"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "4242"}, "abc"),
        ({"SLURM_JOB_ID": "4242", "JOB_ID": "j9"}, "4242"),
    ],
)
def test_job_id(environ, expected):
    assert config.job_id(environ) == expected


def test_percent_sign_in_setup_cfg(tmp_path):
    write(tmp_path, "setup.cfg", "[ddpwatch]\ndir = /scratch/100%\n")
    try:
        cfg = load(environ={}, cwd=str(tmp_path))
    except ConfigError:
        return
    assert cfg.dir == "/scratch/100%"
