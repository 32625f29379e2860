"""Another local user sharing the temp dir: the live-job registry, report folders and rank dumps. No torch.

The attacker is played by the test itself: it pre-creates folders, plants entries and swaps folders for symlinks in
the window the code under test leaves open. Where an attacker must own a file or folder the test chowns it to
another uid, which needs root; those tests are skipped otherwise.
"""

import json
import os
import stat
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import incident, seed_states  # noqa: E402

from ddpwatch import analysis, demo, dump_client, registry
from ddpwatch.format import documents  # noqa: E402
from ddpwatch.render import report  # noqa: E402

OTHER_UID = 54321
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user (chown) needs root")


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The system temp dir, moved into tmp_path: a shared, sticky, world-writable folder like /tmp."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    return shared


def user_root(temp_dir):
    return temp_dir / f"ddpwatch-{os.getuid()}"


@pytest.fixture
def victim():
    """A process of this user that SIGUSR1 would kill (its default action): what a planted entry aims at."""
    proc = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


def exact_entry(pid, **extra):
    """The entry an attacker can forge for `pid`: its start time and name are readable by anyone in /proc."""
    import psutil

    proc = psutil.Process(pid)
    return dict(
        {
            "pid": pid,
            "rank": 0,
            "world_size": 1,
            "job": "planted",
            "dir": "/nowhere",
            "created": proc.create_time(),
            "command": proc.name(),
        },
        **extra,
    )


def plant(folder, entry, name=None):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or f"{entry['pid']}.json")
    path.write_text(json.dumps(entry))
    return path


def still_running(proc):
    time.sleep(0.3)  # a signal is delivered asynchronously
    return proc.poll() is None


# ---------------------------------------------------------------- the registry


@pytest.mark.real
def test_a_world_writable_registry_is_refused_and_nothing_is_signalled(temp_dir, victim, capsys):
    root = user_root(temp_dir)
    root.mkdir()
    os.chmod(root, 0o777)  # pre-created loosely (by another user's umask, or chmod'ed on purpose)
    planted = plant(root / "ranks", {"pid": victim.pid, "rank": 0, "world_size": 1, "job": "x", "dir": "/x"})
    assert dump_client.dump(wait=0.2) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writable by others" in err and str(root) in err
    assert still_running(victim)
    assert planted.exists()
    assert dump_client.list_ranks() == 1 and "writable by others" in capsys.readouterr().err
    assert registry.register({"pid": os.getpid(), "rank": 0, "world_size": 1, "job": "j", "dir": "/r"}) is None
    assert os.listdir(root / "ranks") == [planted.name]


@pytest.mark.real
@as_root
def test_a_registry_folder_owned_by_another_user_is_refused(temp_dir, victim, capsys):
    root = user_root(temp_dir)
    planted = plant(root / "ranks", exact_entry(victim.pid))
    for path in (root, root / "ranks", planted):
        os.chown(path, OTHER_UID, OTHER_UID)
    os.chmod(root, 0o700)
    assert dump_client.dump(pid=victim.pid, wait=0.2) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"uid {OTHER_UID}" in err
    assert still_running(victim) and planted.exists()


def test_a_symlinked_ranks_folder_is_never_followed(temp_dir, tmp_path, capsys):
    victim_folder = tmp_path / "victim"
    victim_folder.mkdir()
    for name in ("settings.json", "1.json", f"{os.getpid()}.json"):
        (victim_folder / name).write_text("{}")
    root = user_root(temp_dir)
    root.mkdir(mode=0o700)
    os.symlink(victim_folder, root / "ranks")
    assert dump_client.list_ranks() == 1
    assert "symlink" in capsys.readouterr().err
    assert registry.register({"pid": os.getpid(), "rank": 0, "world_size": 1, "job": "j", "dir": "/r"}) is None
    assert sorted(os.listdir(victim_folder)) == sorted(["settings.json", "1.json", f"{os.getpid()}.json"])


def test_a_symlinked_user_root_is_never_followed(temp_dir, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, user_root(temp_dir))
    assert registry.register({"pid": os.getpid(), "rank": 0, "world_size": 1, "job": "j", "dir": "/r"}) is None
    assert os.listdir(elsewhere) == []
    assert dump_client.list_ranks() == 1 and "symlink" in capsys.readouterr().err


def test_an_own_folder_left_readable_is_made_private(temp_dir):
    root = user_root(temp_dir)
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)  # as ddpwatch itself used to leave it
    path = registry.register({"pid": os.getpid(), "rank": 0, "world_size": 1, "job": "j", "dir": "/r"})
    try:
        assert path is not None
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(root / "ranks").st_mode) == 0o700
    finally:
        registry.unregister(path)


@pytest.mark.real
def test_entries_forged_or_stale_are_not_signalled(temp_dir, victim, capsys):
    """In the user's own private registry: only an entry whose start time AND command match is signalled."""
    ranks = user_root(temp_dir) / "ranks"
    registry.registry()  # creates the private folders
    exact = exact_entry(victim.pid)
    for forged in (
        {k: v for k, v in exact.items() if k != "created"},  # no start time to check
        dict(exact, created=exact["created"] - 50),  # an older process that had this pid
        dict(exact, command="python3"),
    ):  # another program
        plant(ranks, forged)
        assert dump_client.dump(pid=victim.pid, wait=0.2) == 1
        assert "not an armed ddpwatch rank" in capsys.readouterr().err
        assert still_running(victim)
        assert not (ranks / f"{victim.pid}.json").exists()  # ours, and stale: removed


@pytest.mark.real
def test_only_files_ddpwatch_wrote_are_read_or_removed(temp_dir, tmp_path, victim):
    ranks = user_root(temp_dir) / "ranks"
    registry.registry()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(exact_entry(victim.pid)))
    os.symlink(elsewhere, ranks / f"{victim.pid}.json")  # a link to an entry is not an entry
    other = plant(ranks, {"pid": 999999999}, name="notes.json")  # not ddpwatch's name pattern
    stale = plant(ranks, {"pid": 999999998, "created": 1.0, "command": "python"})
    assert registry.registry() == []
    assert dump_client.dump(pid=victim.pid, wait=0.2) == 1
    assert still_running(victim)
    assert os.path.islink(ranks / f"{victim.pid}.json") and elsewhere.exists() and other.exists()
    assert not stale.exists()


@pytest.mark.real
@as_root
def test_an_entry_file_of_another_user_is_neither_signalled_nor_removed(temp_dir, victim):
    ranks = user_root(temp_dir) / "ranks"
    registry.registry()
    planted = plant(ranks, exact_entry(victim.pid))
    os.chown(planted, OTHER_UID, OTHER_UID)
    assert dump_client.dump(pid=victim.pid, wait=0.2) == 1
    assert still_running(victim) and planted.exists()


@pytest.mark.real
def test_a_sigkilled_ranks_entry_never_signals_the_process_that_reused_its_pid(temp_dir, victim):
    """The rank is SIGKILLed (no unregister); a new process gets its pid: dump must leave the newcomer alone."""
    ranks = user_root(temp_dir) / "ranks"
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = registry.register({"pid": rank.pid, "rank": 0, "world_size": 1, "job": "j", "dir": "/r"})
        recorded = json.loads((ranks / os.path.basename(path)).read_text())
    finally:
        rank.kill()
        rank.wait()
    # The kernel gave the pid to `victim`: the entry now names it, as a pid reuse would.
    reused = dict(recorded, pid=victim.pid)
    plant(ranks, reused)
    os.remove(path)
    assert dump_client.dump(pid=victim.pid, wait=0.2) == 1
    assert still_running(victim)


def test_the_registry_entry_keeps_no_arguments(temp_dir):
    secret = "--token=hunter2"
    path = registry.register(
        {
            "pid": os.getpid(),
            "rank": 0,
            "world_size": 1,
            "job": "j",
            "dir": "/r",
            "argv": f"train.py {secret}",
            "program": "train.py",
        }
    )
    try:
        text = open(path).read()
        assert "hunter2" not in text and '"argv"' not in text
        assert json.loads(text)["program"] == "train.py"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        registry.unregister(path)


@pytest.mark.real
def test_a_real_entry_is_found_and_signalled(temp_dir):
    """The checks let the genuine case through: a process that registered itself is listed and signalled."""
    code = (
        "import os, signal, sys, time; from ddpwatch import registry\n"
        "got = []\nsignal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
        "path = registry.register({'pid': os.getpid(), 'rank': 0, 'world_size': 1, 'job': 'j', 'dir': sys.argv[1],"
        " 'program': 'x'})\nprint(path, flush=True)\n"
        "deadline = time.time() + 30\nwhile not got and time.time() < deadline: time.sleep(0.02)\n"
        "folder = os.path.join(sys.argv[1], 'run1')\nos.makedirs(folder)\n"
        "open(os.path.join(folder, 'report.json'), 'w').close()\nregistry.unregister(path)\n"
    )
    out = os.path.dirname(str(temp_dir)) + "/reports"
    os.makedirs(out)
    env = dict(os.environ, TMPDIR=str(temp_dir), PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", code, out], env=env, stdout=subprocess.PIPE, text=True)
    try:
        path = proc.stdout.readline().strip()
        assert path.endswith(f"{proc.pid}.json")
        [entry] = registry.registry()
        assert entry["pid"] == proc.pid and entry["program"] == "x"
        assert dump_client.dump(wait=20) == 0
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- report folders


def seed_incident():
    st = seed_states(2)
    return incident(st, analysis.assess(st, 2, 2.0, 300.0).findings, run_id="run1")


def test_the_fallback_report_folder_is_in_the_users_private_folder(temp_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folder, note = documents.save_incident(str(blocker / "reports"), "run1", seed_incident(), report.renderings)
    assert folder == str(user_root(temp_dir) / "reports" / "run1")
    assert stat.S_IMODE(os.stat(user_root(temp_dir)).st_mode) == 0o700
    assert folder in note


def test_the_fallback_refuses_a_shared_folder_made_ready_by_someone_else(temp_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    root = user_root(temp_dir)
    (root / "reports").mkdir(parents=True)
    os.chmod(root, 0o777)
    with pytest.raises(OSError, match="writable by others"):
        documents.save_incident(str(blocker / "reports"), "run1", seed_incident(), report.renderings)
    assert os.listdir(root / "reports") == []


def test_a_staging_folder_swapped_for_a_symlink_is_never_written_through(tmp_path, temp_dir, monkeypatch):
    """The attacker owns the report folder's parent and swaps the staging folder for a link to ~/.ssh."""
    base = tmp_path / "shared-reports"
    base.mkdir()
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    os.chmod(ssh, 0o700)
    original = documents._fill

    def swap_then_fill(target, doc, renderings):
        [staging] = [name for name in os.listdir(base) if name.startswith(".incoming-")]
        os.rename(base / staging, base / "moved-away")
        os.symlink(ssh, base / staging)
        return original(target, doc, renderings)

    monkeypatch.setattr(documents, "_fill", swap_then_fill)
    try:
        documents.save_incident(str(base), "run1", seed_incident(), report.renderings)
    except OSError:
        pass  # refusing is fine; writing into ~/.ssh or changing its mode is not
    assert os.listdir(ssh) == []
    assert stat.S_IMODE(os.stat(ssh).st_mode) == 0o700


def test_the_demo_reports_go_to_a_private_folder(temp_dir, monkeypatch):
    seen = {}

    def no_ranks(command, nprocs, env=None, **kwargs):
        seen["dir"] = env["DDPWATCH_DIR"]
        return []

    monkeypatch.setattr(demo, "run_ranks", no_ranks)
    demo.run_demo()
    assert seen["dir"] == str(user_root(temp_dir) / "demo")
    assert stat.S_IMODE(os.stat(user_root(temp_dir)).st_mode) == 0o700


def test_the_demo_refuses_a_folder_it_cannot_trust(temp_dir, monkeypatch, capsys):
    root = user_root(temp_dir)
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setattr(demo, "run_ranks", lambda *a, **k: pytest.fail("ran although the folder is unsafe"))
    assert demo.run_demo() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writable by others" in err


# ---------------------------------------------------------------- rank dumps written when the store is lost


def rank_doc():
    return dict(seed_states(2)[0], store_lost=True)


def test_a_rank_dump_gets_the_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = documents.save_rank_dump(str(tmp_path / "local-x"), rank_doc())
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_a_rank_dump_falls_back_to_the_private_folder(tmp_path, temp_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = documents.save_rank_dump(str(blocker / "local-x"), rank_doc())
    assert path == str(user_root(temp_dir) / "reports" / "local-x" / "rank-0.json")


def test_a_planted_symlink_as_the_local_dump_folder_is_not_written_through(tmp_path, temp_dir):
    """In a shared, world-writable DDPWATCH_DIR another user can plant `local-...` as a link to a folder of theirs (or
    a victim's) before the store is lost: the dump goes to this user's private folder instead."""
    shared, target = tmp_path / "shared", tmp_path / "theirs"
    shared.mkdir()
    target.mkdir()
    os.chmod(shared, 0o1777)
    os.symlink(target, shared / "local-x")
    path = documents.save_rank_dump(str(shared / "local-x"), rank_doc())
    assert os.listdir(target) == []
    assert path == str(user_root(temp_dir) / "reports" / "local-x" / "rank-0.json")


@as_root
def test_a_local_dump_folder_owned_by_another_user_is_refused(tmp_path, temp_dir):
    shared = tmp_path / "shared"
    planted = shared / "local-x"
    planted.mkdir(parents=True)
    os.chmod(shared, 0o1777)
    os.chmod(planted, 0o777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    path = documents.save_rank_dump(str(planted), rank_doc())
    assert os.listdir(planted) == []
    assert path == str(user_root(temp_dir) / "reports" / "local-x" / "rank-0.json")


def test_the_local_dump_folder_of_this_user_is_used_with_the_umask_mode(tmp_path):
    old = os.umask(0o002)
    try:
        path = documents.save_rank_dump(str(tmp_path / "parent" / "local-x"), rank_doc())
    finally:
        os.umask(old)
    assert path == str(tmp_path / "parent" / "local-x" / "rank-0.json")
    assert stat.S_IMODE(os.stat(tmp_path / "parent" / "local-x").st_mode) == 0o775  # readable by the team


FULL_DISK = r"""
import os, resource, signal, sys, tempfile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, as on a full disk
tempfile.tempdir = sys.argv[2]
from ddpwatch.format import documents
doc = {"format_version": 1, "rank": 0, "world_size": 2, "padding": "x" * 100000}
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
print(documents.save_rank_dump(sys.argv[1], doc))
"""


@pytest.mark.real
def test_a_failed_rank_dump_leaves_no_temp_file(tmp_path, temp_dir):
    folder = tmp_path / "local-x"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(folder), str(temp_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=root),
    )
    assert done.returncode == 0, done.stderr
    assert "nowhere" in done.stdout
    left = [os.path.join(d, n) for d, _, names in os.walk(tmp_path) for n in names if n.startswith(".rank-")]
    assert left == []
