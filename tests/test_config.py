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
    assert (cfg.enabled, cfg.dir, cfg.timeout, cfg.action, cfg.grace, cfg.interval, cfg.dead_after,
            cfg.ring_size, cfg.exit_code, cfg.lint_ignore) == (
        False, "./ddpwatch-reports", 300.0, "report", 2.0, 0.5, 10.0, 2048, 3, ())
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
    setup_cfg = write(tmp_path, "setup.cfg", "[metadata]\nname = x\n\n[ddpwatch]\n"
                      "timeout = 10\ngrace = 3\ninterval = 1\ndead-after = 20\n")
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


@pytest.mark.parametrize("layers, expected", [
    ((), 300.0),
    (("cfg",), 10.0),
    (("cfg", "toml"), 20.0),
    (("cfg", "toml", "env"), 30.0),
    (("cfg", "toml", "env", "arg"), 40.0),
    (("toml",), 20.0),
    (("env",), 30.0),
    (("cfg", "arg"), 40.0),
])
def test_precedence_layer_by_layer(tmp_path, layers, expected):
    if "cfg" in layers:
        write(tmp_path, "setup.cfg", "[ddpwatch]\ntimeout = 10\n")
    if "toml" in layers:
        write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\ntimeout = 20\n")
    environ = {"DDPWATCH_TIMEOUT": "30"} if "env" in layers else {}
    overrides = {"timeout": "40"} if "arg" in layers else {}
    assert load(overrides, environ=environ, cwd=str(tmp_path)).timeout == expected


def test_file_values_of_every_type(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\nenabled = true\nring-size = 64\nexit_code = 7\n"
          'lint_ignore = ["ddp004", "DDP001"]\naction = "ABORT"\ndir = "/scratch/r"\n')
    cfg = load(environ={}, cwd=str(tmp_path))
    assert (cfg.enabled, cfg.ring_size, cfg.exit_code, cfg.lint_ignore, cfg.action, cfg.dir) == (
        True, 64, 7, ("DDP004", "DDP001"), "abort", "/scratch/r")


def test_setup_cfg_values_are_parsed(tmp_path):
    write(tmp_path, "setup.cfg", "[ddpwatch]\nenabled = yes\nring_size = 16\nlint_ignore = DDP004, ddp002\n")
    cfg = load(environ={}, cwd=str(tmp_path))
    assert (cfg.enabled, cfg.ring_size, cfg.lint_ignore) == (True, 16, ("DDP004", "DDP002"))


def test_files_without_a_ddpwatch_section_are_ignored(tmp_path):
    write(tmp_path, "setup.cfg", "[metadata]\nname = x\n[tool:pytest]\ntimeout = 5\n")
    write(tmp_path, "pyproject.toml", "[tool.black]\nline-length = 100\n")
    assert load(environ={}, cwd=str(tmp_path)) == Config()


def test_environment_variables(tmp_path):
    environ = {"DDPWATCH": "on", "DDPWATCH_ACTION": " Abort ", "DDPWATCH_EXIT_CODE": "255",
               "DDPWATCH_RING_SIZE": "8", "DDPWATCH_DIR": "/r", "DDPWATCH_LINT_IGNORE": "ddp001,,DDP002 "}
    cfg = load(environ=environ, cwd=str(tmp_path))
    assert (cfg.enabled, cfg.action, cfg.exit_code, cfg.ring_size, cfg.dir, cfg.lint_ignore) == (
        True, "abort", 255, 8, "/r", ("DDP001", "DDP002"))
    assert cfg.sources["enabled"] == "DDPWATCH"


@pytest.mark.parametrize("var, value, option, accepted", [
    ("DDPWATCH_ACTION", "explode", "action", "report or abort"),
    ("DDPWATCH_TIMEOUT", "-1", "timeout", "a positive number of seconds"),
    ("DDPWATCH_TIMEOUT", "abc", "timeout", "a positive number of seconds"),
    ("DDPWATCH_TIMEOUT", "0", "timeout", "a positive number of seconds"),
    ("DDPWATCH_GRACE", "nan", "grace", "a positive number of seconds"),
    ("DDPWATCH_INTERVAL", "inf", "interval", "a positive number of seconds"),
    ("DDPWATCH", "maybe", "enabled", "1/0, true/false, yes/no, on/off"),
    ("DDPWATCH_RING_SIZE", "0", "ring_size", "a positive integer"),
    ("DDPWATCH_RING_SIZE", "2.5", "ring_size", "a positive integer"),
    ("DDPWATCH_EXIT_CODE", "256", "exit_code", "an integer from 1 to 255"),
    ("DDPWATCH_EXIT_CODE", "0", "exit_code", "an integer from 1 to 255"),
])
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


@pytest.mark.parametrize("overrides, option", [
    ({"action": "explode"}, "action"),
    ({"timeout": True}, "timeout"),
    ({"timeout": -5}, "timeout"),
    ({"ring_size": 1.5}, "ring_size"),
    ({"enabled": "maybe"}, "enabled"),
])
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
    write(tmp_path, "setup.cfg", "timeout = 5\n")  # no section header
    with pytest.raises(ConfigError, match="cannot read"):
        load(environ={}, cwd=str(tmp_path))


def test_unrelated_environment_is_ignored(tmp_path):
    assert load(environ={"DDPWATCHX": "1", "DDPWATCH_UNKNOWN": "x", "TIMEOUT": "1"}, cwd=str(tmp_path)) == Config()


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_is_enabled_in():
    assert config.is_enabled_in({}) is False
    assert config.is_enabled_in({"DDPWATCH": "1"}) is True
    assert config.is_enabled_in({"DDPWATCH": "off"}) is False
    with pytest.raises(ConfigError, match="'maybe'"):
        config.is_enabled_in({"DDPWATCH": "maybe"})


@pytest.mark.parametrize("environ, expected", [
    ({}, ""),
    ({"TORCHELASTIC_RUN_ID": "abc123"}, "abc123"),
    ({"TORCHELASTIC_RUN_ID": "none"}, ""),
    ({"TORCHELASTIC_RUN_ID": "None", "SLURM_JOB_ID": "4242"}, "4242"),
    ({"TORCHELASTIC_RUN_ID": "", "JOB_ID": "j9"}, "j9"),
    ({"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "4242"}, "abc"),
    ({"SLURM_JOB_ID": "4242", "JOB_ID": "j9"}, "4242"),
])
def test_job_id(environ, expected):
    assert config.job_id(environ) == expected


def test_percent_sign_in_setup_cfg(tmp_path):
    write(tmp_path, "setup.cfg", "[ddpwatch]\ndir = /scratch/100%\n")
    try:
        cfg = load(environ={}, cwd=str(tmp_path))
    except ConfigError:
        return
    assert cfg.dir == "/scratch/100%"
