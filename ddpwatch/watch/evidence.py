"""Evidence gathered around a verdict in the live process: process facts, progress bars, native stacks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from .. import catalogue, flight_entries
from ..format import build
from . import flight_support

if TYPE_CHECKING:  # annotations only: psutil is imported where it is used, and may be missing
    import psutil

    from ..format.types import ProcessFacts, RankState, RecordDoc

PY_SPY_TIMEOUT_S = 3.0


# ---------------------------------------------------------------- this process, as psutil and tqdm see it


class ProcessSampler:
    """psutil facts about this process; CPU use is measured between two calls (blocked vs busy)."""

    def __init__(self):
        self._proc: psutil.Process | None
        try:
            import psutil

            self._proc = psutil.Process()
            self._proc.cpu_percent(interval=None)
        except Exception:
            self._proc = None

    def facts(self) -> ProcessFacts | None:
        if self._proc is None:
            return None
        try:
            with self._proc.oneshot():
                return {
                    "status": self._proc.status(),
                    "cpu_percent": self._proc.cpu_percent(interval=None),
                    "rss_mb": round(self._proc.memory_info().rss / 2**20, 1),
                    "threads": self._proc.num_threads(),
                }
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}


def peer_process_facts(pid: int) -> dict | None:
    """psutil's view of another process on this host: exists or not, its state, CPU seconds used so far (all
    threads); None if psutil cannot say."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            status = proc.status()
            if status == psutil.STATUS_ZOMBIE:
                return {"exists": False, "status": status}
            times = proc.cpu_times()
            return {
                "exists": True,
                "status": status,
                "cpu_s": round(times.user + times.system, 3),
                "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                "threads": proc.num_threads(),
            }
    except psutil.NoSuchProcess:
        return {"exists": False}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


# What a silent peer on this host is doing, from psutil (its watchdog thread cannot tell us: one thread holding the
# GIL in a long C call, such as sum(range(N)), pickling a big object, or a C library sleeping in the kernel without
# releasing the GIL (ctypes.PyDLL, h5py on slow storage, some database drivers), silences every other thread).
GONE, FROZEN, BUSY, WAITING, UNKNOWN = "gone", "frozen", "busy", "waiting", "unknown"
# psutil's status names: a process in one of these runs no code at all, whatever its CPU counters say. Only these
# (and a process that is gone) count as frozen: a process sleeping in the kernel may wake up any moment (issue 18).
HALTED_STATUSES = ("stopped", "tracing-stop", "dead", "zombie")
# A frozen process still ticks a little (the TCPStore server thread on rank 0, gloo's threads): a tenth of a core
# tells computing apart from that background noise, also on a machine so loaded that a busy rank gets little CPU.
BUSY_CPU_SHARE = 0.1


def cpu_share(now: dict | None, before: dict | None, seconds_between: float) -> float | None:
    """The share of one core a process used between two looks (1.0 = one core all the time), or None."""
    if not now or not before or seconds_between <= 0 or "cpu_s" not in now or "cpu_s" not in before:
        return None
    return max(0.0, now["cpu_s"] - before["cpu_s"]) / seconds_between


def peer_condition(now: dict | None, before: dict | None, seconds_between: float) -> dict:
    """Gone, frozen, busy or waiting, from psutil's looks at a peer whose heartbeat stopped:
    {"condition", "why", "cpu_share"}.

    gone: no such process (or a zombie). frozen: stopped, traced or dead: it runs no code until someone resumes it.
    busy: running, or its CPU time advances between the looks. waiting: asleep in the kernel using no CPU (a C call
    that holds the GIL while it waits, uninterruptible disk I/O): not frozen, since it may return any moment; only
    the straggler timeout may report it. unknown: psutil cannot look (not installed, no permission).
    """
    if not now or "error" in now or ("status" not in now and now.get("exists") is not False):
        return {"condition": UNKNOWN, "why": (now or {}).get("error") or "psutil cannot look at it", "cpu_share": None}
    status = now.get("status")
    if now.get("exists") is False:
        return {"condition": GONE, "why": "the process no longer exists", "cpu_share": None}
    share = cpu_share(now, before, seconds_between)
    used = f", {share:.0%} of a CPU over the last {seconds_between:.1f} s" if share is not None else ""
    if status in HALTED_STATUSES:
        return {"condition": FROZEN, "why": f"{status}{used}", "cpu_share": share}
    if status == "running" or (share is not None and share >= BUSY_CPU_SHARE):
        return {"condition": BUSY, "why": f"{status}{used}", "cpu_share": share}
    return {"condition": WAITING, "why": f"{status}{used}", "cpu_share": share}


def progress_bars() -> list:
    """Live tqdm bars of this process (only if the program imported tqdm): description, n/total, idle seconds."""
    tqdm_module = sys.modules.get("tqdm.std") or sys.modules.get("tqdm")
    bar_class = getattr(tqdm_module, "tqdm", None)
    instances = getattr(bar_class, "_instances", None)
    if not instances:
        return []
    now = time.time()
    bars = []
    for bar in list(instances):
        try:
            last = getattr(bar, "last_print_t", None) or getattr(bar, "start_t", now)
            if last is None:
                continue  # a bar without its times (start_t None): one that says nothing of its progress
            bars.append(
                {
                    "desc": str(getattr(bar, "desc", "") or ""),
                    "n": int(bar.n),
                    "total": None if bar.total is None else int(bar.total),
                    "since_update_s": round(max(0.0, now - last), 1),
                }
            )
        except Exception:
            continue
    return bars


# ---------------------------------------------------------------- native stacks through py-spy


def native_stacks(pid: int, timeout: float = PY_SPY_TIMEOUT_S, native: bool = True) -> dict:
    """py-spy's dump of a process (with native frames unless native=False, which also works on a stopped
    process): {"threads": [...]} or {"unavailable": "one line why"}."""
    binary = shutil.which("py-spy")
    if binary is None:
        return {"unavailable": "py-spy is not installed (pip install py-spy); Python stacks only"}
    command = [binary, "dump", "--pid", str(pid), "--json"]
    if native and sys.platform.startswith("linux"):
        command.append("--native")
    elif not native:
        command.append("--nonblocking")  # a SIGSTOPped process can only be read without pausing it
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"unavailable": f"py-spy did not answer within {timeout:g} s; Python stacks only"}
    except OSError as exc:
        return {"unavailable": f"py-spy could not start ({exc}); Python stacks only"}
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        text = reason[-1] if reason else f"exit status {done.returncode}"
        if "ermission" in text or "ptrace" in text.lower():
            text += " (needs ptrace permission: --cap-add SYS_PTRACE, or kernel.yama.ptrace_scope=0)"
        return {"unavailable": f"py-spy failed: {text[:300]}; Python stacks only"}
    try:
        threads = json.loads(done.stdout)
    except ValueError:
        return {"unavailable": "py-spy printed no JSON; Python stacks only"}
    return {"threads": [_compact_thread(t) for t in threads]}


def _compact_thread(thread: dict) -> dict:
    frames = []
    for frame in thread.get("frames") or ():
        frames.append(
            {
                "function": frame.get("name"),
                "file": frame.get("filename") or frame.get("module"),
                "line": frame.get("line"),
            }
        )
    return {
        "thread": thread.get("thread_name") or str(thread.get("thread_id")),
        "active": thread.get("active"),
        "owns_gil": thread.get("owns_gil"),
        "frames": frames[:80],
    }  # innermost first, as py-spy prints


def python_stack_from_py_spy(dump: dict, is_internal) -> list:
    """py-spy's threads (innermost first) as ddpwatch stacks (innermost last, frames marked internal or not)."""
    stacks = []
    for index, thread in enumerate(dump.get("threads") or ()):
        frames = [
            {
                "file": f.get("file") or "?",
                "line": f.get("line") or 0,
                "function": f.get("function") or "?",
                "internal": is_internal(f.get("file") or "<unknown>"),
            }
            for f in reversed(thread.get("frames") or ())
        ]
        stacks.append(
            {
                "thread": thread.get("thread"),
                "main": thread.get("thread") == "MainThread"
                or (index == 0 and not any(t.get("thread") == "MainThread" for t in dump["threads"])),
                "frames": frames,
            }
        )
    return stacks


# ---------------------------------------------------------------- torch's Flight Recorder, where it is on

FR_TAIL = 16


def flight_recorder_tail(limit: int = FR_TAIL) -> dict:
    """The last entries of torch's Flight Recorder for this process: every c10d op, DDP's C++ ones included.

    Where the Python patches are blind (the gradient all-reduce inside backward) this shows what the process group
    itself last issued. {"entries": [...]} or {"unavailable": "why"}; never raises.
    """
    data = flight_support.read_dump()
    if data is None:
        return {"unavailable": "this torch's Flight Recorder cannot be read"}
    entries = data["entries"]
    if not entries:
        return {"unavailable": "Flight Recorder is off or empty (TORCH_FR_BUFFER_SIZE=0?)"}
    return {"entries": [_compact_fr_entry(e) for e in entries[-limit:]], "total": len(entries)}


def flight_recorder_active() -> list:
    """The Flight Recorder's entries not yet retired (on gloo `state` stays "scheduled": `retired` is what moves),
    oldest first; only-active, no stack traces: the cheapest dump (pickle: about 3x faster than JSON at 2,000
    entries, `python -m benchmarks.flight_recorder`). [] when it is off or unreadable; never raises."""
    data = flight_support.read_dump(only_active=True)
    if data is None:
        return []
    entries = [e for e in data["entries"] if isinstance(e, dict)]
    return sorted(flight_entries.in_flight(entries), key=lambda e: e.get("time_created_ns") or 0)


def record_from_flight_recorder(entry: dict, state: RankState, frame, now: float) -> RecordDoc | None:
    """A record for a collective only the Flight Recorder saw, at the position this rank's recorded ops reach next.

    ddpwatch's sequence numbers count the collectives it recorded; an op it never saw takes the next one on its
    group, which lines up with the peers as long as every rank's unseen ops are the same. Its line is where the
    training thread stands now in the user's code.
    """
    group = flight_entries.group_of(entry)
    created = (entry.get("time_created_ns") or 0) / 1e9
    if not created:
        return None
    from ..capture.sites import frame_site

    last = (state.get("last_seq") or {}).get(group)  # a live state's: an int, or no key before its first
    shapes, dtypes = flight_entries.shapes_and_dtypes(entry, build.TENSORS_KEPT)
    return build.record(
        (-1 if last is None else last) + 1,
        group,
        flight_entries.canonical_op(entry.get("profiling_name"))[0],
        api=build.FLIGHT_RECORDER_ONLY,
        p2p=False,
        peer=None,
        shapes=shapes,
        dtypes=dtypes,
        site=frame_site(frame),
        via=None,
        region=None,
        start=round(created, 6),
        age_s=round(max(0.0, now - created), 4),
        duration_s=None,
        state=build.IN_FLIGHT,
        error=None,
        thread="MainThread",
        flight_recorder={"seq": entry.get("collective_seq_id"), "op": entry.get("profiling_name")},
    )


def _compact_fr_entry(entry: dict) -> dict:
    group = entry.get("process_group") or ["?", ""]
    return {
        "seq": entry.get("collective_seq_id"),
        "p2p_seq": entry.get("p2p_seq_id"),
        "group": str(group[0]),
        "op": str(entry.get("profiling_name", "")).split(":")[-1],
        "sizes": entry.get("input_sizes"),
        "state": entry.get("state"),
        "retired": entry.get("retired"),
        "is_p2p": entry.get("is_p2p"),
    }


def align_flight_recorder(state: RankState) -> None:
    """Pair each in-flight record with the Flight Recorder's last entry on its group, when they name the same op.

    The pair confirms what the process group itself has in flight (DDP's gradient all-reduce, issued in C++, is
    recorded by ddpwatch only at the backward() call) and gives the c10d-level sequence number, which counts the
    C++ collectives too. The match is by group and op name only: a hint for the reader, not used for verdicts.
    """
    entries = (state.get("flight_recorder") or {}).get("entries") or []
    if not entries:
        return
    last_by_group: dict = {}
    for entry in entries:
        if not entry.get("is_p2p"):
            last_by_group[entry.get("group")] = entry
    for record in state.get("inflight") or ():
        entry = last_by_group.get(record.get("group"))
        if entry and catalogue.canonical_op(entry.get("op")) == catalogue.canonical_op(record.get("op")):
            record["flight_recorder"] = {
                "seq": entry.get("seq"),
                "op": entry.get("op"),
                "retired": entry.get("retired"),
                "sizes": entry.get("sizes"),
            }
