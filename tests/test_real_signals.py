"""A program's own SIGTERM / SIGINT handling on real gloo ranks ends the same with DDPWATCH=1 as without it."""

import os
import signal

import pytest
import torch

from ranks import ROOT, SCENARIOS, describe, run_case

import ddpwatch.bootstrap as bootstrap

SIGNALS = os.path.join(SCENARIOS, "signals.py")
pytestmark = pytest.mark.timeout(150)


def run_signalled(case, signum, folder, watched):
    """Run `case` on 2 ranks; once both are ready, send `signum` to both at once. (results, checkpoints)."""
    ready_dir, ckpt_dir = folder / "ready", folder / "checkpoints"
    ready_dir.mkdir(parents=True)
    ckpt_dir.mkdir()
    sent = []

    def signal_both_when_ready():
        if not sent and sorted(os.listdir(ready_dir)) == ["0.ready", "1.ready"]:
            pids = [int((ready_dir / f"{rank}.ready").read_text()) for rank in (0, 1)]
            for pid in pids:
                os.kill(pid, signum)
            sent.extend(pids)
        return False  # never kill the group: the ranks end by themselves, or at run_ranks' limit

    # DDPWATCH=1 the way `ddpwatch run` sets it up: the bootstrap folder first on PYTHONPATH (no install needed)
    activation = dict(DDPWATCH="1", PYTHONPATH=os.pathsep.join((bootstrap.BOOTSTRAP_DIR, ROOT))) if watched else {}
    results = run_case([SIGNALS, case], 2, folder / "reports", timeout=60, stop_when=signal_both_when_ready,
                       READY_DIR=ready_dir, CKPT_DIR=ckpt_dir, DDPWATCH_INTERVAL=0.2, **activation)
    assert sent, describe(results)
    armed = [f"SIGNALS rank {r.rank} ddpwatch armed={int(watched)}" in r.stderr for r in results]
    assert armed == [True, True], describe(results)
    checkpoints = {}
    for name in sorted(os.listdir(ckpt_dir)):
        checkpoints[name] = torch.load(ckpt_dir / name) if name.endswith(".pt") else None  # a .tmp: cut short
    return results, checkpoints


def outcome(results, checkpoints):
    """What the program did: exit codes, the files it left, and its own log lines."""
    lines = [sorted(line for line in r.stderr.splitlines() if line.startswith("SIGNALS") and "armed=" not in line)
             for r in results]
    return [r.returncode for r in results], checkpoints, lines


@pytest.mark.parametrize("case", ["term_after", "term_before"])
def test_the_programs_sigterm_handler_runs_as_without_ddpwatch(tmp_path, case):
    """Issue 18: a handler installed after ddpwatch armed was raced by ddpwatch's default action (exit -15)."""
    plain = outcome(*run_signalled(case, signal.SIGTERM, tmp_path / "plain", watched=False))
    watched = outcome(*run_signalled(case, signal.SIGTERM, tmp_path / "watched", watched=True))
    codes, checkpoints, lines = plain
    assert codes == [0, 0], plain  # the scenario's own ending, without ddpwatch
    assert checkpoints == {f"rank{r}.pt": {"rank": r, "how": "sigterm"} for r in (0, 1)}, plain
    assert [[line for line in rank if "saved" in line] for rank in lines] == [
        [f"SIGNALS rank {r} sigterm: saved"] for r in (0, 1)], plain
    assert watched == plain


def test_sigint_raises_keyboardinterrupt_as_without_ddpwatch(tmp_path):
    plain = outcome(*run_signalled("interrupt", signal.SIGINT, tmp_path / "plain", watched=False))
    watched = outcome(*run_signalled("interrupt", signal.SIGINT, tmp_path / "watched", watched=True))
    codes, checkpoints, _ = plain
    assert codes == [130, 130] and checkpoints == {f"rank{r}.pt": {"rank": r, "how": "sigint"} for r in (0, 1)}
    assert watched == plain


def test_sigterm_without_a_handler_ends_a_rank_blocked_in_a_barrier_by_the_signal(tmp_path):
    plain = outcome(*run_signalled("blocked", signal.SIGTERM, tmp_path / "plain", watched=False))
    watched = outcome(*run_signalled("blocked", signal.SIGTERM, tmp_path / "watched", watched=True))
    assert plain == ([-signal.SIGTERM, -signal.SIGTERM], {}, [["SIGNALS rank 0 ready"], ["SIGNALS rank 1 ready"]])
    assert watched == plain
