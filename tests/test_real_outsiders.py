"""What an outsider writes into a correct job's store, a scheduler's stop, and another job of the same user (issue 41):
2 gloo ranks each, hard time limits, every process killed by its group.

The test process hosts the job's store where an outsider is needed (as rank 0 would) and forges on it from a
thread of its own: a correct job must end as it would without ddpwatch, with no report and no traceback."""

import contextlib
import json
import os
import re
import signal
import threading
import time

import psutil
import pytest

from ranks import SCENARIOS, describe, finish_job, load_only_report, reports, run_case, start_job, torchrun_job
from test_real_store_attack import NAMESPACE, host_store

FAULTS = os.path.join(SCENARIOS, "faults.py")
SILENT = os.path.join(SCENARIOS, "silent.py")
FP1 = f"{NAMESPACE}/fp/1"
# Long enough: before their fixes, forged documents ended the job within 2.5-5 s, and a huge value (one write in five,
# the forger writing continuously) is read, if it is read at all, at every round: 0.2 s apart here. 12 s until
# c97f73c: the suite is CPU-bound and at its 8-minute line.
TRAIN_S = 8
pytestmark = pytest.mark.timeout(200)


class Forger:
    """A thread on its own client of the job's store: once rank 1 has published its completed positions, rewrite
    them every 10 ms with `forge(real document, n)` (the rank publishes its own once a round in between)."""

    def __init__(self, store, forge):
        self.client, self.forge, self.written = store.clone(), forge, 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(10)

    def _run(self):
        real = None
        while not self.stopped.wait(0.01):
            try:
                if not self.client.check([FP1]):
                    continue
                doc = json.loads(bytes(self.client.get(FP1)).decode())
                if doc.get("n", 0) < 10**6:
                    real = doc
                if real is not None:
                    self.client.set(FP1, self.forge(real, 10**6 + self.written))
                    self.written += 1
            except Exception:
                if self.stopped.is_set():
                    return  # the job ended and took its store with it


def other_reduce_op(real, n):
    """A well-formed document that says rank 1 did MAX over int32 wherever it did anything."""
    doc = json.loads(json.dumps(real))
    for signature in doc["signatures"].values():
        signature.update(reduce="max", dtypes=["int32"] * len(signature["dtypes"]))
    return json.dumps(dict(doc, n=n))


# Where a value of the wrong type goes in rank 1's real document (its newest position's signature, its group's
# numbering), and the value: each one, unchecked, raised inside the comparison (tests/test_store_input.py counts 92
# such documents among 483); a value is compared only at positions both ranks published, so these edit the real one.
MALFORMED = [
    (("sig", "dtypes"), [[1]]),
    (("sig", "counts"), [[4]]),
    (("sig", "site"), {"file": "f.py", "line": {"a": 1}, "function": "f"}),
    (("sig", "reduce"), ["max"]),
    (("sig", "op"), {"a": 1}),
    (("sig", "root"), {"a": 1}),
    (("group", "first"), "0"),
    (("group", "ids"), [[0]]),
    (("doc", "signatures"), ["x"]),
]
HUGE = 6 * 2**20  # the probe wrote 5.7 MiB


def malformed_or_huge(real, n):
    """Rank 1's real document with one value of the wrong type (MALFORMED, in turn), or, every fifth write, the
    signature of its newest position naming a 6 MiB line."""
    doc = json.loads(json.dumps(real))
    group = next(iter(doc["groups"].values()))
    signature = doc["signatures"][str(group["ids"][-1])]
    if n % 5 == 0:
        signature["site"] = {"file": "x" * HUGE, "line": 1, "function": "f"}
    else:
        (where, key), value = MALFORMED[n % len(MALFORMED)]
        {"sig": signature, "group": group, "doc": doc}[where][key] = value
    return json.dumps(dict(doc, n=n))


def trained(folder, action, forge=None, seconds=TRAIN_S, watch=None):
    """The correct job (faults.py train) for `seconds` on a store hosted here, `forge` (if any) rewriting rank 1's
    fingerprints, `watch(store)` (if any) polled while it runs: (results, the store, forged writes, each rank's peak
    memory in KiB)."""
    port, store = host_store()
    forger = Forger(store, forge) if forge else None
    with forger or contextlib.nullcontext():
        results = run_case(
            [FAULTS, f"train:{seconds}"],
            2,
            folder,
            timeout=seconds + 80,
            stop_when=watch and (lambda: watch(store)),
            STORE_PORT=port,
            DDPWATCH_ACTION=action,
            DDPWATCH_GRACE=0.5,
            DDPWATCH_INTERVAL=0.2,
            DDPWATCH_ON_INCIDENT=f"echo hook >> {folder}/hooks",
        )
    peaks = [int(m) for r in results for m in re.findall(r"TRAINED \d maxrss_kib (\d+)", r.stderr)]
    return results, store, forger.written if forger else 0, peaks


def test_forged_fingerprints_never_end_a_correct_job_under_abort_and_report_nothing(tmp_path):
    """Before: exit 3 within 2.5-5 s as silent_mismatch or crossed_collectives; under report, false reports. Now
    the rank the forged document describes answers the incident with its own record, which refutes it."""
    results, _, written, _ = trained(tmp_path, "abort", other_reduce_op)
    assert written >= 100, describe(results)  # forged throughout the run
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert reports(tmp_path) == [] and not os.path.exists(tmp_path / "hooks"), describe(results)
    assert all("Traceback" not in r.stderr for r in results), describe(results)


def test_malformed_and_huge_fingerprints_cost_no_traceback_and_no_memory(tmp_path):
    """Before: 9 of 17 malformed shapes raised in the comparison (a traceback per rank); a 5.7 MiB value took a rank
    from 265 to 648 MiB. Peak memory is compared with the same job unforged, run just before."""
    plain, _, _, plain_peaks = trained(tmp_path / "plain", "abort")
    results, _, written, peaks = trained(tmp_path / "forged", "abort", malformed_or_huge)
    assert written >= 50, describe(results)
    assert [r.returncode for r in plain + results] == [0, 0, 0, 0], describe(plain + results)
    assert all("Traceback" not in r.stderr and "watchdog error" not in r.stderr for r in results), describe(results)
    assert reports(tmp_path / "forged") == []
    assert len(peaks) == len(plain_peaks) == 2, describe(results)
    assert max(peaks) <= 1.10 * max(plain_peaks), (peaks, plain_peaks)
    left_out = [r.stderr.count("left out the fp document") for r in results]
    assert sum(left_out) >= 1 and max(left_out) <= 1, left_out  # one line, once, on the rank comparing


def torchrun(args, report_dir, **env):
    """A torchrun job of 2 ranks in a session of its own, started: (Popen, its output file)."""
    return start_job(*torchrun_job(args, 2, report_dir, **env))


def finished(job, output, timeout):
    """The job's output once it ended (or `timeout` later, killed whole)."""
    return finish_job(job, output, timeout)[1]


def workers(job):
    try:
        return [p for p in psutil.Process(job.pid).children(recursive=True) if "faults.py" in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def test_sigterm_to_every_rank_of_a_correct_job_is_a_stop_with_no_report_and_no_hook(tmp_path):
    """A scheduler (or Kubernetes) stops a job with SIGTERM to every rank: before, a dead_rank report and an
    on_incident run in 4/4 runs, when a rank waited in a collective as its peer went. Rank 0 validates alone for 30 s
    here while rank 1 waits in the epoch's barrier; the SIGTERM comes once rank 1 says it waits there."""
    job, output = torchrun(
        [FAULTS, "benign:30:2"], tmp_path, DDPWATCH_GRACE=0.5, DDPWATCH_ON_INCIDENT=f"echo hook >> {tmp_path}/hooks"
    )
    sent = False
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not sent and job.poll() is None:
            output.seek(0)
            if "BENIGN-WAITS 0" in output.read():
                time.sleep(1.0)  # inside the barrier, past the grace
                for worker in workers(job):
                    worker.send_signal(signal.SIGTERM)
                sent = True
            time.sleep(0.1)
    finally:
        text = finished(job, output, 40)
    assert sent and "exitcode  : -15" in text, text[-3000:]
    time.sleep(1.0)  # an on_incident command, had one started, writes its line
    assert reports(tmp_path) == [] and not (tmp_path / "hooks").exists(), text[-3000:]


def test_two_jobs_started_together_each_name_their_own_crash(tmp_path):
    """Fault files were named by the second and the rank: two jobs of one user started in the same second shared
    them, and one job's report named the other's crash. Each job here has gloo abort rank 1 at a line of its own;
    while they run, the fault files seen are two jobs' (by their names), each job's for both its ranks."""
    faults = tmp_path / f"ddpwatch-{os.getuid()}" / "faults"
    time.sleep(1.0 - time.time() % 1.0)  # both start at the top of a second: they arm in the same second, mostly
    jobs = {case: torchrun([SILENT, case], tmp_path / case, TMPDIR=tmp_path) for case in ("sizes", "sizes_elsewhere")}
    seen: set = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(job.poll() is None for job, _ in jobs.values()):
            seen |= set(os.listdir(faults)) if faults.exists() else set()  # a survivor's own goes at its exit
            time.sleep(0.05)
    finally:
        outputs = {case: finished(job, output, 10) for case, (job, output) in jobs.items()}
    jobs_seen = {name.split("-rank-")[0]: set() for name in seen}
    for name in seen:
        jobs_seen[name.split("-rank-")[0]].add(name.split("-rank-")[1].split("-")[0].split(".")[0])
    assert list(jobs_seen.values()) == [{"0", "1"}, {"0", "1"}], (seen, outputs)
    # Each report shows the crashed rank 1 where its own job's fault file put it, never at the other job's line.
    # (A job's report can be lost under load, torchrun's SIGTERM ending the survivor first: 1 of 5 whole-suite runs
    # here, cause not found yet. That is no file shared, so it is said, not failed; both jobs losing it fails.)
    lines = {"sizes": "log_loss", "sizes_elsewhere": "log_grad"}
    named = {}
    for case, text in outputs.items():
        if not reports(tmp_path / case):
            print(f"{case}: no report; its output ends:\n{text[-3000:]}")
            continue
        [crashed] = [state for state in load_only_report(tmp_path / case)["ranks"] if state["rank"] == 1]
        functions = {frame["function"] for stack in crashed.get("stacks") or () for frame in stack["frames"]}
        named[case] = functions & set(lines.values())
    assert named and all(functions == {lines[case]} for case, functions in named.items()), (named, outputs)
