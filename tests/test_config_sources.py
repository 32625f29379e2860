"""Every configuration source, and how each one fails: fast, no processes, an explicit environ and a tmp_path cwd."""

import logging
import os
import re
import subprocess
import sys

import pytest

from ddpwatch import config, config_files
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


@pytest.mark.parametrize(
    "text",
    [
        "[ddpwatch]\ntimeout = 5\ntimeout = 6\n",  # duplicate option
        "[ddpwatch]\ntimeout = 5\n[ddpwatch]\ngrace = 1\n",  # duplicate section
        "timeout = 5\n[ddpwatch]\ngrace = 3\n",  # no section header above the first line
        "[ddpwatch]\n  indented continuation\n",  # parsing error
    ],
)
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
    monkeypatch.setattr(config_files, "_toml", lambda: None)  # Python < 3.11 without tomli
    write(tmp_path, "pyproject.toml", "[tool.black]\nline-length = 100\n")
    assert load(environ={}, cwd=str(tmp_path)) == config.Config()  # nothing of ours there: no error
    pyproject = write(tmp_path, "pyproject.toml", "[tool.black]\nx = 1\n\n[ tool.ddpwatch ]\ntimeout = 5\n")
    with pytest.raises(ConfigError, match="tomli") as info:
        load(environ={}, cwd=str(tmp_path))
    assert pyproject in str(info.value) and "setup.cfg" in str(info.value)


def test_tomli_is_the_fallback_parser():
    source = open(os.path.join(ROOT, "ddpwatch", "config_files.py"), encoding="utf-8").read()
    assert re.search(r"except ImportError:.*\n\s+try:\n\s+import tomli as tomllib", source)


def test_environment_variable_of_every_option(tmp_path):
    raw = {
        "enabled": "yes",
        "dir": "/r",
        "timeout": "9",
        "action": "abort",
        "grace": "1.5",
        "interval": "0.25",
        "dead_after": "4",
        "ring_size": "16",
        "exit_code": "9",
        "lint_ignore": "ddp001",
        "signals": "off",
        "recorder": "Flight",
        "user_packages": "mylab, other",
        "library_packages": "trainkit",
        "on_incident": "notify hang",
        "native_stacks": "no",
        "relay": "On",
    }
    assert set(raw) == set(config.OPTIONS_BY_NAME), "a new option needs a row here"
    environ = {config.OPTIONS_BY_NAME[name].env_var: value for name, value in raw.items()}
    cfg = load(environ=environ, cwd=str(tmp_path))
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
        cfg.signals,
        cfg.recorder,
        cfg.user_packages,
        cfg.library_packages,
        cfg.on_incident,
        cfg.native_stacks,
        cfg.relay,
    ) == (
        True,
        "/r",
        9.0,
        "abort",
        1.5,
        0.25,
        4.0,
        16,
        9,
        ("DDP001",),
        False,
        "flight",
        ("mylab", "other"),
        ("trainkit",),
        "notify hang",
        False,
        "on",
    )
    assert all(cfg.sources[name] == config.OPTIONS_BY_NAME[name].env_var for name in raw)


def test_an_unknown_recorder_is_an_error_naming_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="pyhton.*recorder.*auto, python, flight"):
        load(environ={"DDPWATCH_RECORDER": "pyhton"}, cwd=str(tmp_path))


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
    assert str(info.value) == (
        f"ddpwatch: bad value {value!r} for signals (from environment variable "
        f"DDPWATCH_SIGNALS): accepted: 1/0, true/false, yes/no, on/off"
    )


def test_bad_value_in_setup_cfg_names_file_option_value_and_accepted(tmp_path):
    setup_cfg = write(tmp_path, "setup.cfg", "[ddpwatch]\nexit-code = 0\n")
    with pytest.raises(ConfigError) as info:
        load(environ={}, cwd=str(tmp_path))
    assert str(info.value) == (
        f"ddpwatch: bad value '0' for exit_code (from {setup_cfg} [ddpwatch]): accepted: an integer from 1 to 255"
    )


def test_a_file_error_comes_before_a_good_environment(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\naction = 'explode'\n")
    with pytest.raises(ConfigError, match="'explode' for action"):
        load(environ={"DDPWATCH_ACTION": "report"}, cwd=str(tmp_path))


# ----- names ddpwatch does not know: one warning each, with the nearest real name (issue 13 point 7) -----


@pytest.fixture
def warnings_seen(monkeypatch, caplog):
    """The ddpwatch warnings logged during the test, as text; the once-per-process memory starts empty."""
    monkeypatch.setattr(config_files, "_warned", set())
    caplog.set_level(logging.WARNING, logger="ddpwatch")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "ddpwatch"]


@pytest.mark.parametrize(
    "name, suggestion",
    [
        ("DDPWATCH_TIMOUT", "DDPWATCH_TIMEOUT"),
        ("DDPWATCH_DEADAFTER", "DDPWATCH_DEAD_AFTER"),
        ("ddpwatch_grace", "DDPWATCH_GRACE"),  # variable names are case-sensitive
        ("DDPWATCH_ENABLED", "DDPWATCH"),
        ("DDPWATCH_REPORT_DIR", "DDPWATCH_DIR"),
    ],
)
def test_a_misspelt_variable_is_a_warning_with_did_you_mean(tmp_path, warnings_seen, name, suggestion):
    cfg = load(environ={name: "5"}, cwd=str(tmp_path))
    assert cfg == config.Config()  # ignored, as before, but no longer silently
    assert warnings_seen() == [
        f"ddpwatch: ignoring the environment variable {name}: no such option; did you mean {suggestion}?"
    ]


def test_an_unknown_variable_with_no_near_name_lists_the_known_ones(tmp_path, warnings_seen):
    load(environ={"DDPWATCH_QQQQQQ": "1"}, cwd=str(tmp_path))
    [message] = warnings_seen()
    assert "DDPWATCH_QQQQQQ: no such option; known: DDPWATCH, DDPWATCH_ACTION," in message
    assert "did you mean" not in message


def test_each_unknown_variable_is_warned_about_once_per_process(tmp_path, warnings_seen):
    environ = {"DDPWATCH_TIMOUT": "5", "DDPWATCH_GRCE": "1"}
    for _ in range(3):
        load(environ=environ, cwd=str(tmp_path))
    assert sorted(warnings_seen()) == [
        "ddpwatch: ignoring the environment variable DDPWATCH_GRCE: no such option; did you mean DDPWATCH_GRACE?",
        "ddpwatch: ignoring the environment variable DDPWATCH_TIMOUT: no such option; did you mean DDPWATCH_TIMEOUT?",
    ]


def test_known_and_unrelated_variables_give_no_warning(tmp_path, warnings_seen):
    raw = {
        "enabled": "0",
        "dir": "/tmp",
        "timeout": "300",
        "action": "report",
        "grace": "2",
        "interval": "0.5",
        "dead_after": "10",
        "ring_size": "64",
        "exit_code": "3",
        "lint_ignore": "",
        "signals": "1",
        "recorder": "python",
        "user_packages": "mylab",
        "library_packages": "",
        "on_incident": "",
        "native_stacks": "on",
        "relay": "off",
    }
    assert set(raw) == set(config.OPTIONS_BY_NAME), "a new option needs a value here"
    environ = {config.OPTIONS_BY_NAME[name].env_var: value for name, value in raw.items()}
    environ.update({"DDPWATCHX": "1", "MY_DDPWATCH_TIMEOUT": "1", "PATH": "/bin"})
    load(environ=environ, cwd=str(tmp_path))
    assert warnings_seen() == []


@pytest.mark.real
def test_the_warning_reaches_stderr_once_in_a_real_process(tmp_path):
    code = "import ddpwatch.config as c; c.load(); c.load(); print('RAN')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPWATCH")}
    env.update(PYTHONPATH=ROOT, DDPWATCH_TIMOUT="5")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "RAN\n", done.stderr
    assert done.stderr == (
        "ddpwatch: ignoring the environment variable DDPWATCH_TIMOUT: no such option; did you mean DDPWATCH_TIMEOUT?\n"
    )


@pytest.mark.parametrize(
    "file, text, found, meant",
    [
        ("setup.cfg", "[DDPWATCH]\ntimeout = 5\n", "DDPWATCH", "ddpwatch"),
        ("setup.cfg", "[tool:ddpwatch]\ntimeout = 5\n", "tool:ddpwatch", "ddpwatch"),
        ("pyproject.toml", "[tool.DDPWATCH]\ntimeout = 5\n", "tool.DDPWATCH", "tool.ddpwatch"),
        ("pyproject.toml", "[DDPWatch]\ntimeout = 5\n", "DDPWatch", "tool.ddpwatch"),
        ("pyproject.toml", "[ddpwatch]\ntimeout = 5\n", "ddpwatch", "tool.ddpwatch"),
        ("pyproject.toml", "[Tool.ddpwatch]\ntimeout = 5\n", "Tool.ddpwatch", "tool.ddpwatch"),
    ],
)
def test_a_section_in_the_wrong_case_or_place_is_a_warning(tmp_path, warnings_seen, file, text, found, meant):
    path = write(tmp_path, file, text)
    assert load(environ={}, cwd=str(tmp_path)).timeout == 300.0
    load(environ={}, cwd=str(tmp_path))
    assert warnings_seen() == [
        f"ddpwatch: ignoring [{found}] in {path}: section names are case-sensitive; did you mean [{meant}]?"
    ]


def test_a_right_section_next_to_a_wrong_one_is_read_and_the_wrong_one_warned_about(tmp_path, warnings_seen):
    write(tmp_path, "setup.cfg", "[ddpwatch]\ntimeout = 7\n[DDPWATCH]\ntimeout = 5\n")
    assert load(environ={}, cwd=str(tmp_path)).timeout == 7.0
    assert len(warnings_seen()) == 1


def test_a_misspelt_key_inside_the_section_stays_an_error_and_suggests_the_name(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.ddpwatch]\ntimout = 5\n")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) timout in .* \(did you mean timeout\?\)"):
        load(environ={}, cwd=str(tmp_path))


# ----- a file that cannot be parsed is ddpwatch's problem only if it holds ddpwatch settings -----


@pytest.mark.parametrize(
    "file, text",
    [
        ("pyproject.toml", "[project\nname = 'x'\n"),
        ("pyproject.toml", "[project]\nname = 'x'\nname = 'y'\n"),
        ("pyproject.toml", "[project]\ndependencies = ['ddpwatch', 'torch'\n"),  # names ddpwatch, not a section of it
        ("setup.cfg", "name = x\n[metadata]\n"),
        ("setup.cfg", "[metadata]\nname = x\nname = y\n"),
    ],
)
def test_an_unrelated_file_that_cannot_be_parsed_is_ignored(tmp_path, warnings_seen, file, text):
    write(tmp_path, file, text)
    assert load(environ={"DDPWATCH_TIMEOUT": "9"}, cwd=str(tmp_path)).timeout == 9.0
    assert warnings_seen() == []


def test_an_unrelated_file_that_is_not_utf8_is_ignored(tmp_path):
    (tmp_path / "pyproject.toml").write_bytes(b"[project]\nname = '\xff'\n")
    (tmp_path / "setup.cfg").write_bytes(b"[metadata]\nname = \xff\n")
    assert load(environ={}, cwd=str(tmp_path)) == config.Config()


@pytest.mark.parametrize(
    "file, text",
    [
        ("pyproject.toml", "[tool.ddpwatch]\ntimeout = 5\n[project\n"),
        ("pyproject.toml", "[project\n[tool.ddpwatch]\ntimeout = 5\n"),
        ("pyproject.toml", "tool.ddpwatch.timeout = 5\n[[broken\n"),
        ("pyproject.toml", "[tool]\nddpwatch = { timeout = 5 \n"),
        ("pyproject.toml", "[tool.DDPWATCH]\ntimeout = 5\n[project\n"),
        ("setup.cfg", "name = x\n[ddpwatch]\ntimeout = 5\n"),
        ("setup.cfg", "[metadata]\nname = x\nname = y\n[ddpwatch]\ntimeout = 5\n"),
    ],
)
def test_a_file_with_ddpwatch_settings_that_cannot_be_parsed_is_an_error(tmp_path, file, text):
    path = write(tmp_path, file, text)
    with pytest.raises(ConfigError, match=f"cannot read {re.escape(path)}, which holds ddpwatch settings: "):
        load(environ={}, cwd=str(tmp_path))


def activation_env(**extra):
    """The environment of `ddpwatch run`: DDPWATCH=1 and the bootstrap first, then this checkout."""
    from ddpwatch.bootstrap import BOOTSTRAP_DIR

    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPWATCH") and k != "PYTHONPATH"}
    env.update(DDPWATCH="1", PYTHONPATH=os.pathsep.join([BOOTSTRAP_DIR, ROOT]), **extra)
    return env


@pytest.mark.real
def test_every_python_process_still_runs_under_ddpwatch_1_next_to_a_broken_unrelated_pyproject(tmp_path):
    write(tmp_path, "pyproject.toml", "[project\nname = 'x'\n")
    done = subprocess.run(
        [sys.executable, "-c", "import ddpwatch.bootstrap as b; print('RAN', bool(b.activated_by))"],
        env=activation_env(),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "RAN True\n", "")


# ----- helpers used by activation -----


def test_is_enabled_in_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("DDPWATCH", "yes")
    assert config.is_enabled_in() is True
    monkeypatch.delenv("DDPWATCH")
    assert config.is_enabled_in() is False


def test_activation_environ_puts_the_bootstrap_first_once():
    env = config.activation_environ(
        "/boot", {"PYTHONPATH": "/a" + os.pathsep + "/boot" + os.pathsep, "X": "1", "DDPWATCH": "0"}
    )
    assert env["PYTHONPATH"] == "/boot" + os.pathsep + "/a"
    assert env["DDPWATCH"] == "1" and env["X"] == "1"
    assert config.activation_environ("/boot", {})["PYTHONPATH"] == "/boot"


def test_the_run_tag_names_torchruns_attempt_so_that_a_restart_is_a_new_run():
    assert config.run_tag({"TORCHELASTIC_RUN_ID": "j1", "TORCHELASTIC_RESTART_COUNT": "2"}) == "j1-attempt2"
    assert config.run_tag({"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}) == "attempt0"
    assert config.run_tag({"SLURM_JOB_ID": "77"}) == "77" == config.job_id({"SLURM_JOB_ID": "77"})
    assert config.run_tag({"TORCHELASTIC_RESTART_COUNT": "../x"}) == ""  # only digits reach a folder's name


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
        shown = (
            {False: "off", True: "on", (): "none", None: "none"}.get(default, default)
            if not isinstance(default, (int, float)) or isinstance(default, bool)
            else f"{default:g}"
        )
        assert row[2] == str(shown), (option.name, row[2], shown)
