"""Issue 41's probes, re-run: what an outsider on the job's store port, a scheduler's stop and another job of the same
user do to a correct job (or to a real hang's verdict), one row each.

    python -m benchmarks.outsiders [--only NAME ...] [--seconds S]

Each probe runs 2 gloo ranks of tests/scenarios/faults.py (torchrun where a launcher matters) on a store this process
hosts, as rank 0 would, and writes to it from a thread of its own; it prints what happened beside what must happen.
Exit status 1 when a row is not as it must be. The helpers are the real tests' own (tests/ranks.py,
tests/test_real_outsiders.py); this script adds the probes those tests do not run and the figures they do not print.
"""

from __future__ import annotations

import json
import os
import pathlib

import subprocess
import sys
import tempfile
import threading
import time

from . import _common as C

sys.path.insert(0, os.path.join(C.ROOT, "tests"))
# The tests' ranks are forked from a server that imported torch (tests/zygote.py); a benchmark's ranks start as a
# user's do, each its own interpreter: what it measures (time, memory) is then what a user's job pays.
os.environ["DDPWATCH_TEST_EXEC"] = "1"

import ranks as R  # noqa: E402
import test_real_outsiders as T  # noqa: E402
from test_real_store_attack import NAMESPACE, host_store, read  # noqa: E402

FAULTS = os.path.join(R.SCENARIOS, "faults.py")
ROWS: list = []


def row(name: str, happened: str, must: str, ok: bool) -> None:
    ROWS.append((name, happened, must, "ok" if ok else "NOT OK"))
    print(f"{name}: {happened} (must: {must}) {'ok' if ok else 'NOT OK'}", flush=True)


def hooks(folder) -> int:
    path = os.path.join(str(folder), "hooks")
    return open(path).read().count("hook") if os.path.exists(path) else 0


def incidents_opened(store) -> int:
    from ddpwatch.watch.store import ABSENT, INCIDENT_UNIT

    raw = bytes(store.compare_set(f"{NAMESPACE}/counters", ABSENT, ABSENT))
    return int(raw) // INCIDENT_UNIT if raw.isdigit() else 0


def probe_forged_fingerprints(tmp: str, seconds: float) -> None:
    for action in ("abort", "report"):
        folder = os.path.join(tmp, f"forged-{action}")
        results, store, written, _ = T.trained(folder, action, T.other_reduce_op, seconds)
        codes = [r.returncode for r in results]
        found = len(R.reports(folder))
        row(
            f"forged fingerprints, action={action}",
            f"exit {codes}, {found} reports, {hooks(folder)} hook runs, {incidents_opened(store)} incidents opened, "
            f"{written} forged writes",
            "exit [0, 0], no report, no hook",
            codes == [0, 0] and found == 0 and hooks(folder) == 0,
        )


def probe_flood(tmp: str, seconds: float) -> None:
    """Forged fingerprints that differ every write (another line each time): each one a new reading to report."""
    folder = os.path.join(tmp, "flood")

    def new_line_each_time(real, n):
        doc = json.loads(T.other_reduce_op(real, n))
        for signature in doc["signatures"].values():
            signature["site"] = {"file": f"forged_{n}.py", "line": n, "function": "@channel <https://x.example|click>"}
        return json.dumps(doc)

    results, store, written, _ = T.trained(folder, "report", new_line_each_time, seconds)
    opened = incidents_opened(store)
    found = len(R.reports(folder))
    row(
        "a flood of forged fingerprints",
        f"{opened} incidents opened, {found} reports, {hooks(folder)} hook runs in {seconds:g} s ({written} writes)",
        f"incidents within the budget ({opened} <= 3 + {seconds:g}/20 per rank), no report, no hook",
        found == 0 and hooks(folder) == 0 and opened <= 2 * (3 + seconds / 20),
    )


def probe_malformed_and_huge(tmp: str, seconds: float) -> None:
    _, _, _, plain = T.trained(os.path.join(tmp, "plain"), "abort", seconds=seconds)
    results, _, written, peaks = T.trained(os.path.join(tmp, "malformed"), "abort", T.malformed_or_huge, seconds)
    tracebacks = sum(r.stderr.count("Traceback") for r in results)
    ratio = max(peaks) / max(plain) if peaks and plain else float("nan")
    row(
        "malformed and 6 MiB fingerprints",
        f"{tracebacks} tracebacks; peak memory {max(peaks or [0]) / 1024:.0f} MiB vs {max(plain or [0]) / 1024:.0f} "
        f"MiB unforged ({ratio:.2f}x); {written} forged writes",
        "no traceback, memory within 10%",
        tracebacks == 0 and ratio <= 1.10,
    )


def probe_forged_mismatch_verdict(tmp: str, seconds: float) -> None:
    """Open an incident and post {"mismatch": ...} under action=abort, as anyone on the port can."""
    from ddpwatch.watch.store import INCIDENT_UNIT

    folder = os.path.join(tmp, "mismatch-verdict")
    posted: list = []

    def forge(store):
        if posted or not all(read(store, f"pos/{rank}") for rank in (0, 1)):
            return False
        number = store.add(f"{NAMESPACE}/counters", INCIDENT_UNIT) // INCIDENT_UNIT
        info = {"trigger": "mismatch", "leader": 0, "action": "abort", "fingerprint": "forged"}
        store.set(f"{NAMESPACE}/incident/{number}/info", json.dumps(info))
        time.sleep(0.5)
        verdict = {"action": "abort", "kinds": ["silent_mismatch"], "mismatch": {"group": "0", "seq": 1}}
        store.set(f"{NAMESPACE}/incident/{number}/verdict", json.dumps(verdict))
        posted.append(number)
        return False

    results, _, _, _ = T.trained(folder, "abort", seconds=seconds, watch=forge)
    codes = [r.returncode for r in results]
    row(
        "a forged mismatch verdict, action=abort", f"posted {len(posted)}, exit {codes}", "exit [0, 0]", codes == [0, 0]
    )


def failure_of(test, folder: str) -> str | None:
    """Run one of the real tests on `folder` (its tmp_path): None when it passes, else its assertion's text."""
    os.makedirs(folder)
    try:
        test(pathlib.Path(folder))
    except AssertionError as exc:
        return str(exc)[:300]
    return None


def probe_sigterm(tmp: str, seconds: float) -> None:
    folder = os.path.join(tmp, "sigterm")
    failed = failure_of(T.test_sigterm_to_every_rank_of_a_correct_job_is_a_stop_with_no_report_and_no_hook, folder)
    row(
        "SIGTERM to every rank (torchrun)",
        f"{len(R.reports(folder))} reports, {hooks(folder)} hook runs" + (f"; {failed}" if failed else ""),
        "no report, no hook",
        failed is None,
    )


def probe_stamp(tmp: str, seconds: float) -> None:
    """The store's stamp key written before the ranks arm; then the store's host dies: where the dumps go."""
    folder = os.path.join(tmp, "stamp", "a", "b", "reports")
    os.makedirs(folder)
    from ddpwatch.launch import free_port

    port = free_port()
    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import datetime, sys, time, torch.distributed as d\n"
            f"s = d.TCPStore('127.0.0.1', {port}, None, True, timeout=datetime.timedelta(seconds=60), "
            "wait_for_workers=False)\n"
            f"s.set('{NAMESPACE}/stamp', 'x/../../../escaped')\n"
            "print('up', flush=True)\n"
            "time.sleep(300)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        host.stdout.readline()
        results = R.run_case(
            [FAULTS, "store_gone"], 2, folder, timeout=60, STORE_PORT=port, STORE_PID=host.pid, DDPWATCH_GRACE=0.5
        )
    finally:
        host.kill()
        host.wait()
    inside = [p for p in os.listdir(folder) if p.startswith("local-")]
    escaped = [p for p in os.listdir(os.path.join(tmp, "stamp")) if "escaped" in p] + [
        p for p in os.listdir(os.path.join(tmp, "stamp", "a")) if "escaped" in p
    ]
    row(
        "a forged stamp, then the store gone",
        f"dumps in {inside or 'no folder'} inside DDPWATCH_DIR; {escaped or 'nothing'} outside; exit "
        f"{[r.returncode for r in results]}",
        "dumps inside DDPWATCH_DIR only",
        bool(inside) and not escaped,
    )


def probe_deleted_keys(tmp: str, seconds: float) -> None:
    """A real hang (the seed stall of faults.py poisoned_hang) while someone deletes the ranks' fingerprint keys."""
    figures = {}
    for deleting in (False, True):
        folder = os.path.join(tmp, f"deleted-{deleting}")
        ready = os.path.join(folder, "ready")
        os.makedirs(ready)
        open(os.path.join(ready, "poisoned"), "w").close()  # no poison: the hang forms at once
        port, store = host_store()
        client, stop = store.clone(), threading.Event()

        def delete(client=client, stop=stop):
            while not stop.wait(0.005):
                try:
                    for rank in (0, 1):
                        client.delete_key(f"{NAMESPACE}/fp/{rank}")
                except Exception:
                    return

        thread = threading.Thread(target=delete, daemon=True)
        if deleting:
            thread.start()
        try:
            results = R.run_case(
                [FAULTS, "poisoned_hang"],
                2,
                folder,
                timeout=60,
                STORE_PORT=port,
                READY_DIR=ready,
                DDPWATCH_ACTION="abort",
                DDPWATCH_GRACE=0.5,
                DDPWATCH_INTERVAL=0.2,
            )
            ended = time.time()
        finally:
            stop.set()
        formed = R.hang_formed_at(results)
        figures[deleting] = (ended - formed if formed else float("nan"), [r.returncode for r in results])
    (plain, plain_codes), (deleted, codes) = figures[False], figures[True]
    row(
        "fingerprint keys deleted during a real hang",
        f"aborted {deleted:.1f} s after the hang formed (exit {codes}); {plain:.1f} s untouched (exit {plain_codes})",
        "aborted (exit 3) as untouched",
        codes == [3, 3] == plain_codes and deleted < plain + 2.0,
    )


def probe_two_jobs(tmp: str, seconds: float) -> None:
    failed = failure_of(T.test_two_jobs_started_together_each_name_their_own_crash, os.path.join(tmp, "two-jobs"))
    row(
        "two jobs started in the same second",
        "each report names its own crash" if failed is None else failed,
        "each report names its own crash; four fault files, two per job",
        failed is None,
    )


PROBES = {
    "forged": probe_forged_fingerprints,
    "mismatch_verdict": probe_forged_mismatch_verdict,
    "malformed": probe_malformed_and_huge,
    "flood": probe_flood,
    "sigterm": probe_sigterm,
    "stamp": probe_stamp,
    "deleted": probe_deleted_keys,
    "two_jobs": probe_two_jobs,
}


def main(argv=None) -> int:
    args = C.parser(__doc__.splitlines()[0])
    args.add_argument("--only", nargs="*", choices=sorted(PROBES), help="run these probes only")
    args.add_argument("--seconds", type=float, default=12.0, help="how long each correct job trains")
    options = args.parse_args(argv)
    C.header("outsiders", options.quick)
    with tempfile.TemporaryDirectory(prefix="ddpwatch-outsiders-") as tmp:
        for name in options.only or PROBES:
            os.makedirs(os.path.join(tmp, name), exist_ok=True)
            PROBES[name](os.path.join(tmp, name), 6.0 if options.quick else options.seconds)
    print()
    C.print_table("issue 41's probes", ["probe", "what happened", "what must happen", ""], ROWS)
    return 0 if all(r[3] == "ok" for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
