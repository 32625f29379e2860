"""Every configuration source, and how each one fails: fast, no processes, an explicit environ and a tmp_path cwd."""

import os
import re

import pytest

from ddpwatch import config
from ddpwatch.config import ConfigError, load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(folder, name, text):
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ----- each source on its own -----

def test_setup_cfg_is_read_literally_without_interpolation(tmp_path):
    write(tmp_path, "setup.cfg", "[ddpwatch]\ndir = /scratch/100%\ntimeout = 7\n")
    cfg = load(environ={}, cwd=str(tmp_path))
    assert cfg.dir == "/scratch/100%" and cfg.timeout == 7.0


def test_percent_references_are_not_expanded_either(tmp_path):
    write(tmp_path, "setup.cfg", "[paths]\nroot = /data\n[ddpwatch]\ndir = %(root)s/reports\n")
    assert load(environ={}, cwd=str(tmp_path)).dir == "%(root)s/reports"


def test_default_section_keys_do_not_leak_into_ddpwatch(tmp_path):
    write(tmp_path, "setup.cfg", "[DEFAULT]\ntimeout = 5\naction = abort\n[ddpwatch]\ngrace = 4\n")
    cfg = load(environ={}, cwd=str(tmp_path))
    assert (cfg.timeout, cfg.action, cfg.grace) == (300.0, "report", 4.0)


def test_default_section_alone_is_no_ddpwatch_section(tmp_path):
    write(tmp_path, "setup.cfg", "[DEFAULT]\nverbose = 1\n")
    assert load(environ={}, cwd=str(tmp_path)) == config.Config()


@pytest.mark.parametrize("text", [
    "[ddpwatch]\ntimeout = 5\ntimeout = 6\n",            # duplicate option
    "[ddpwatch]\ntimeout = 5\n[ddpwatch]\ngrace = 1\n",  # duplicate section
    "timeout = 5\n",                                      # no section header
    "[ddpwatch]\n  indented continuation\n",               # parsing error
])
def test_any_setup_cfg_error_is_a_config_error(tmp_path, text):
    setup_cfg = write(tmp_path, "setup.cfg", text)
    with pytest.raises(ConfigError, match="cannot read") as info:
        load(environ={}, cwd=str(tmp_path))
    assert setup_cfg in str(info.value)


def test_setup_cfg_that_is_not_utf8_is_a_config_error(tmp_path):
    (tmp_path / "setup.cfg").write_bytes(b"[ddpwatch]\ndir = \xff\xfe\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load(environ={}, cwd=str(tmp_path))


def test_pyproject_section(tmp_path):
    pyproject = write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\naction = 'abort'\nsignals = false\n")
    cfg = load(environ={}, cwd=str(tmp_path))
    assert (cfg.action, cfg.signals) == ("abort", False)
    assert cfg.sources["action"] == f"{pyproject} [tool.ddpwatch]"


def test_pyproject_tool_that_is_not_a_table_is_ignored(tmp_path):
    write(tmp_path, "pyproject.toml", "tool = 3\n")
    assert load(environ={}, cwd=str(tmp_path)) == config.Config()


def test_without_a_toml_parser_a_ddpwatch_section_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "tomllib", None)  # Python < 3.11 without tomli
    write(tmp_path, "pyproject.toml", "[tool.black]\nline-length = 100\n")
    assert load(environ={}, cwd=str(tmp_path)) == config.Config()  # nothing of ours there: no error
    pyproject = write(tmp_path, "pyproject.toml", "[tool.black]\nx = 1\n\n[ tool.ddpwatch ]\ntimeout = 5\n")
    with pytest.raises(ConfigError, match="tomli") as info:
        load(environ={}, cwd=str(tmp_path))
    assert pyproject in str(info.value) and "setup.cfg" in str(info.value)


def test_tomli_is_the_fallback_parser():
    source = open(os.path.join(ROOT, "ddpwatch", "config.py"), encoding="utf-8").read()
    assert re.search(r"except ImportError:.*\n\s+try:\n\s+import tomli as tomllib", source)


def test_environment_variable_of_every_option(tmp_path):
    raw = {"enabled": "yes", "dir": "/r", "timeout": "9", "action": "abort", "grace": "1.5", "interval": "0.25",
           "dead_after": "4", "ring_size": "16", "exit_code": "9", "lint_ignore": "ddp001", "signals": "off",
           "user_packages": "mylab, other", "library_packages": "trainkit"}
    assert set(raw) == set(config.OPTIONS_BY_NAME), "a new option needs a row here"
    environ = {config.OPTIONS_BY_NAME[name].env_var: value for name, value in raw.items()}
    cfg = load(environ=environ, cwd=str(tmp_path))
    assert (cfg.enabled, cfg.dir, cfg.timeout, cfg.action, cfg.grace, cfg.interval, cfg.dead_after, cfg.ring_size,
            cfg.exit_code, cfg.lint_ignore, cfg.signals, cfg.user_packages, cfg.library_packages) == (
        True, "/r", 9.0, "abort", 1.5, 0.25, 4.0, 16, 9, ("DDP001",), False, ("mylab", "other"), ("trainkit",))
    assert all(cfg.sources[name] == config.OPTIONS_BY_NAME[name].env_var for name in raw)


def test_arguments_win_over_everything(tmp_path):
    write(tmp_path, "setup.cfg", "[ddpwatch]\nsignals = no\n")
    write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\nsignals = false\n")
    cfg = load({"signals": True}, environ={"DDPWATCH_SIGNALS": "0"}, cwd=str(tmp_path))
    assert cfg.signals is True and cfg.sources["signals"] == "argument"


def test_the_working_directory_is_the_default_cwd(tmp_path, monkeypatch):
    write(tmp_path, "setup.cfg", "[ddpwatch]\ntimeout = 11\n")
    monkeypatch.chdir(tmp_path)
    assert load(environ={}).timeout == 11.0


# ----- bad values and names -----

def test_unknown_override_is_rejected_even_when_its_value_is_none(tmp_path):
    with pytest.raises(ConfigError, match="unknown option.*timout.*guard"):
        load({"timout": None}, environ={}, cwd=str(tmp_path))


def test_known_override_of_none_means_not_given(tmp_path):
    assert load({"timeout": None, "dir": None}, environ={"DDPWATCH_TIMEOUT": "8"}, cwd=str(tmp_path)).timeout == 8.0


@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_bad_signals_value(tmp_path, value):
    with pytest.raises(ConfigError) as info:
        load(environ={"DDPWATCH_SIGNALS": value}, cwd=str(tmp_path))
    assert str(info.value) == (f"ddpwatch: bad value {value!r} for signals (from environment variable "
                               f"DDPWATCH_SIGNALS): accepted: 1/0, true/false, yes/no, on/off")


def test_bad_value_in_setup_cfg_names_file_option_value_and_accepted(tmp_path):
    setup_cfg = write(tmp_path, "setup.cfg", "[ddpwatch]\nexit-code = 0\n")
    with pytest.raises(ConfigError) as info:
        load(environ={}, cwd=str(tmp_path))
    assert str(info.value) == (f"ddpwatch: bad value '0' for exit_code (from {setup_cfg} [ddpwatch]): "
                               f"accepted: an integer from 1 to 255")


def test_a_file_error_comes_before_a_good_environment(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\naction = 'explode'\n")
    with pytest.raises(ConfigError, match="'explode' for action"):
        load(environ={"DDPWATCH_ACTION": "report"}, cwd=str(tmp_path))


# ----- helpers used by activation -----

def test_is_enabled_in_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("DDPWATCH", "yes")
    assert config.is_enabled_in() is True
    monkeypatch.delenv("DDPWATCH")
    assert config.is_enabled_in() is False


def test_activation_environ_puts_the_bootstrap_first_once():
    env = config.activation_environ("/boot", {"PYTHONPATH": "/a" + os.pathsep + "/boot" + os.pathsep, "X": "1",
                                              "DDPWATCH": "0"})
    assert env["PYTHONPATH"] == "/boot" + os.pathsep + "/a"
    assert env["DDPWATCH"] == "1" and env["X"] == "1"
    assert config.activation_environ("/boot", {})["PYTHONPATH"] == "/boot"


def test_rendezvous_address():
    assert config.rendezvous_address({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}) == "10.0.0.1:29500"
    assert config.rendezvous_address({}) == ""


# ----- the documentation -----

def test_every_option_is_documented_with_its_variable_and_default():
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as handle:
        rows = {line.split("|")[1].strip().strip("`"): line for line in handle if line.startswith("| `")}
    for option in config.OPTIONS:
        assert option.name in rows, f"docs/configuration.md has no row for {option.name}"
        row = [cell.strip().strip("`") for cell in rows[option.name].split("|")[1:-1]]
        assert row[1] == option.env_var
        default = option.default
        shown = {False: "off", True: "on", (): "none"}.get(default, default) if not isinstance(default, (int, float)) \
            or isinstance(default, bool) else f"{default:g}"
        assert row[2] == str(shown), (option.name, row[2], shown)
