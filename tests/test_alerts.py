"""After the verdict: the on_incident hook (a command or a callable) and the logging record, on hand-built incidents.

The commands are short shell lines (each test waits for its hook's thread, at most a few seconds); the one real
job with a hook is in tests/test_real_restarts.py."""

import logging
import threading
import time

import pytest

from ddpwatch import config
from ddpwatch.watch import alerts

INCIDENT = {
    "run_id": "20260101-000000-job",
    "trigger": "deadlock",
    "findings": [
        {
            "kind": "ddp_forward_on_subset",
            "ranks": [0],
            "summary": "Rank 0 called the DistributedDataParallel model\nat train.py:54 alone.",
        }
    ],
}
DUMP = {"run_id": "x", "trigger": "dump", "findings": []}


def settings(hook):
    return config.load({"on_incident": hook}, environ={})


def finish(thread, limit=20.0):
    thread.join(limit)
    assert not thread.is_alive(), "the hook's thread did not end"


def alive(pid):
    """Whether `pid` still runs (a killed orphan may stay a zombie until whatever adopted it reaps it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ended_within(pid, ceiling=10.0):
    """Whether `pid` stops running within `ceiling` seconds: a process SIGKILLed a moment ago still has to be given a
    core to exit, which on a loaded machine takes a while (one test read it running right after the kill). The
    ceiling is far below the 120 s the process would sleep if the kill had missed it."""
    deadline = time.monotonic() + ceiling
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_alert_is_one_line_of_this_ranks_own_facts_then_the_findings_words_quoted():
    alert = alerts.alert_of(INCIDENT, "/r/20260101-000000-job")
    assert alert.summary == (
        "ddpwatch: ddp_forward_on_subset (culprit rank 0). Report: /r/20260101-000000-job. "
        'Detail: "Rank 0 called the DistributedDataParallel model at train.py:54 alone."'
    )
    assert (alert.folder, alert.kind, alert.culprits, alert.trigger) == (
        "/r/20260101-000000-job",
        "ddp_forward_on_subset",
        (0,),
        "deadlock",
    )
    assert (
        alerts.alert_of({"findings": [{"kind": "p2p_deadlock", "summary": "\x1b[2Jx"}]}, None).summary
        == 'ddpwatch: p2p_deadlock. Report: (none could be written). Detail: "\\u001b[2Jx"'
    )  # a peer's words never drive a terminal


def test_words_a_peer_supplied_are_quoted_bounded_and_cannot_close_the_quote():
    """Issue 41: a forged fingerprint's text reached a chat hook verbatim ("@channel <https://...|click>"). The
    summary's own part says the kind, culprits, whether it is a reading, and the folder; the finding's words, which
    quote the ranks' records (anyone on the store's port can write one), come last, quoted and at most 240 chars."""
    forged = 'x" ; rm -rf / ; "' + "@channel <https://evil.example|click> " * 40 + "\n\u202e"
    incident = {
        "findings": [{"kind": "silent_mismatch", "ranks": [1], "summary": forged, "basis": {"status": "reading"}}]
    }
    summary = alerts.alert_of(incident, "/r/x").summary
    own, detail = summary.split(". Detail: ")
    assert own == "ddpwatch: silent_mismatch (culprit rank 1) - a reading, not acted on. Report: /r/x"
    assert detail.startswith('"x\\" ; rm') and detail.endswith('..."') and len(detail) == alerts.MAX_DETAIL + 2
    assert detail[1:-1].count('"') == detail[1:-1].count('\\"')  # every quote inside is escaped
    assert summary.isascii() and "\n" not in summary


def test_the_verdict_is_an_error_record_on_the_ddpwatch_logger_with_the_alert_attached(caplog):
    with caplog.at_level(logging.INFO, logger="ddpwatch"):
        alerts.announce(settings(None), INCIDENT, "/r/x")
        alerts.announce(settings(None), DUMP, "/r/y")  # a dump somebody asked for is no alert
    [record] = [r for r in caplog.records if r.name == "ddpwatch"]
    assert record.levelno == logging.ERROR and record.getMessage().startswith("ddpwatch: ddp_forward_on_subset")
    assert record.ddpwatch_incident["folder"] == "/r/x" and record.ddpwatch_incident["culprits"] == (0,)


def test_without_any_handler_no_record_is_made_the_report_on_stderr_says_it_already(monkeypatch):
    made = []
    monkeypatch.setattr(alerts.log, "hasHandlers", lambda: False)
    monkeypatch.setattr(alerts.log, "error", lambda *a, **k: made.append(a))
    alerts.log_verdict(alerts.alert_of(INCIDENT, "/r/x"))
    assert made == []


@pytest.mark.real
def test_the_command_gets_folder_and_summary_in_its_environment_and_not_ddpwatchs_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPWATCH", "1")
    monkeypatch.setenv("DDPWATCH_ACTION", "abort")
    out = tmp_path / "env.txt"
    command = (
        f'printf "%s|%s|%s|%s|%s|%s" "$DDPWATCH_INCIDENT_DIR" "$DDPWATCH_INCIDENT_SUMMARY" '
        f'"$DDPWATCH_INCIDENT_KIND" "$DDPWATCH_INCIDENT_CULPRITS" "${{DDPWATCH-unset}}" '
        f'"${{DDPWATCH_ACTION-unset}}" > {out}'
    )
    finish(alerts.start_hook(command, alerts.alert_of(INCIDENT, str(tmp_path / "incident"))))
    folder, summary, kind, culprits, enabled, action = out.read_text().split("|")
    assert folder == str(tmp_path / "incident") and kind == "ddp_forward_on_subset" and culprits == "0"
    assert summary.startswith("ddpwatch: ddp_forward_on_subset (culprit rank 0). Report: ") and "\n" not in summary
    assert (enabled, action) == ("unset", "unset")  # a Python hook must not start guarding itself


@pytest.mark.real
def test_a_failing_command_is_logged_never_raised(caplog):
    with caplog.at_level(logging.WARNING, logger="ddpwatch"):
        finish(alerts.start_hook("echo going wrong >&2; exit 7", alerts.alert_of(INCIDENT, "/r/x")))
    assert "failed with exit status 7" in caplog.text


@pytest.mark.real
def test_a_command_that_hangs_holds_nothing_up_and_is_killed_at_the_bound(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(alerts, "ON_INCIDENT_TIMEOUT_S", 1.0)
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="ddpwatch"):
        alerts.announce(settings(f"sh -c 'echo $$ > {pid_file}; exec sleep 120' & wait"), INCIDENT, "/r/x")
        assert time.monotonic() - started < 1.0  # announce() returned before the bound: nothing waited for the hook
        [thread] = [t for t in threading.enumerate() if t.name == "ddpwatch-on-incident"]
        finish(thread)
    assert "ran past 1 s and was killed" in caplog.text
    assert ended_within(int(pid_file.read_text())), "the hook's own child outlived the bound"


def test_the_callable_gets_the_alert_on_a_thread_of_its_own():
    seen = []
    finish(
        alerts.start_hook(
            lambda alert: seen.append((alert, threading.current_thread().name)), alerts.alert_of(INCIDENT, "/r/x")
        )
    )
    [(alert, thread_name)] = seen
    assert alert.folder == "/r/x" and alert.culprits == (0,) and thread_name == "ddpwatch-on-incident-call"


def test_a_callable_that_raises_is_logged_never_raised(caplog):
    def hook(alert):
        raise RuntimeError("the pager is down")

    with caplog.at_level(logging.WARNING, logger="ddpwatch"):
        finish(alerts.start_hook(hook, alerts.alert_of(INCIDENT, "/r/x")))
    assert "the on_incident callable" in caplog.text and "the pager is down" in caplog.text


def test_a_callable_that_hangs_is_left_behind_after_the_bound_and_said(monkeypatch, caplog):
    monkeypatch.setattr(alerts, "ON_INCIDENT_TIMEOUT_S", 0.3)
    release = threading.Event()
    try:
        with caplog.at_level(logging.WARNING, logger="ddpwatch"):
            finish(alerts.start_hook(lambda alert: release.wait(60), alerts.alert_of(INCIDENT, "/r/x")))
        assert "still runs after 0.3 s; left running" in caplog.text
    finally:
        release.set()
    for thread in threading.enumerate():
        if thread.name == "ddpwatch-on-incident-call":
            finish(thread)


def test_a_hook_that_cannot_even_start_is_logged(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(alerts.subprocess, "Popen", refuse)
    with caplog.at_level(logging.WARNING, logger="ddpwatch"):
        finish(alerts.start_hook("true", alerts.alert_of(INCIDENT, "/r/x")))
    assert "could not start the on_incident command 'true': no more processes" in caplog.text


def test_on_incident_comes_from_the_environment_a_file_or_a_guard_argument(tmp_path):
    assert config.load(environ={"DDPWATCH_ON_INCIDENT": "notify-send hang"}).on_incident == "notify-send hang"
    (tmp_path / "setup.cfg").write_text("[ddpwatch]\non-incident = page-me\n")
    assert config.load(environ={}, cwd=str(tmp_path)).on_incident == "page-me"
    assert config.load({"on_incident": print}, environ={"DDPWATCH_ON_INCIDENT": "x"}).on_incident is print
    assert config.load(environ={"DDPWATCH_ON_INCIDENT": "  "}).on_incident is None  # switched off
    with pytest.raises(config.ConfigError, match="on_incident"):
        config.load({"on_incident": 5}, environ={})


def test_the_hooks_variables_are_not_warned_about_as_unknown_options(caplog):
    with caplog.at_level(logging.WARNING, logger="ddpwatch"):
        config.load(environ={name: "x" for name in config.INCIDENT_VARIABLES})
    assert "ignoring the environment variable" not in caplog.text
