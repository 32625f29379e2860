"""Loaders read only regular files and build within a budget (issue 18, item 5 b and c); hostile files made here.

A FIFO read blocks forever, so each case that reads one runs `ddpwatch report` in a subprocess with a hard
timeout. Each amplification case loads its file in a subprocess under a 2 GiB address-space limit and reports its
peak RSS, so a regression fails the test instead of eating the machine.
"""

import json
import os
import pickle
import struct
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import seed_states  # noqa: E402
from test_crafted_input import assert_one_line_error, report_cli, seed_incident  # noqa: E402
from test_flight_recorder import seed_dumps, write_dumps  # noqa: E402

from ddpwatch.format import bounded, documents  # noqa: E402
from ddpwatch.sources import flight_recorder_files as fr_files  # noqa: E402

pytestmark = pytest.mark.timeout(240)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADDRESS_LIMIT = 2 * 2**30
QUICK_S = 30  # a FIFO read blocks forever; far longer than refusing one takes on a loaded machine


# ---------------------------------------------------------------- (b) only regular files


@pytest.mark.real
def test_a_fifo_named_rank_0_json_is_refused_not_read(tmp_path):
    fifo = tmp_path / "rank-0.json"
    os.mkfifo(fifo)
    assert_one_line_error(report_cli(fifo, timeout=QUICK_S), "a FIFO, not a regular file")
    real = tmp_path / "rank-1.json"
    real.write_text(json.dumps(seed_states(2)[1]))
    assert_one_line_error(report_cli(fifo, real, timeout=QUICK_S), "a FIFO, not a regular file")  # merge's path


@pytest.mark.real
def test_a_symlink_to_a_device_is_refused_not_read(tmp_path):
    """A symlink is followed (people link files into place); what it points to must still be a regular file."""
    link = tmp_path / "report.json"
    os.symlink("/dev/zero", link)  # read as it was, 256 MiB of zeros before the size check
    assert_one_line_error(report_cli(link, timeout=QUICK_S), "a character device, not a regular file")


@pytest.mark.real
def test_a_fifo_found_by_a_folder_scan_is_skipped_and_said(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank, state in seed_states(2).items():
        (folder / f"rank-{rank}.json").write_text(json.dumps(state))
    os.mkfifo(folder / "rank-2.json")
    done = report_cli(folder, "--format", "json", timeout=QUICK_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ddpwatch: skipped {folder / 'rank-2.json'}: a FIFO" in done.stderr
    assert json.loads(done.stdout)["world_size"] == 2


@pytest.mark.real
def test_a_fifo_flight_recorder_dump_is_skipped_and_said(tmp_path):
    folder = write_dumps(tmp_path / "fr", seed_dumps())
    os.mkfifo(folder / "fr_trace_2")
    done = report_cli("--flight-recorder", folder, "--format", "json", timeout=QUICK_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ddpwatch: skipped {folder / 'fr_trace_2'}: a FIFO" in done.stderr
    assert [f["ranks"] for f in json.loads(done.stdout)["findings"]] == [[0]]
    os.unlink(folder / "fr_trace_0")
    os.unlink(folder / "fr_trace_1")
    done = report_cli("--flight-recorder", folder, timeout=QUICK_S)  # nothing else there: an error, still quick
    assert done.returncode == 2 and "skipped" in done.stderr and "no Flight Recorder dump" in done.stderr


# ---------------------------------------------------------------- (c) hostile files: pickle opcodes by hand


def shared_lists(levels, width=10, leaf=100):
    """Pickle opcodes leaving one list on the stack: `levels` levels of `width` references to the level below,
    a string of `leaf` characters at the bottom. Its repr is about leaf * width**levels characters; the opcodes
    are about 25 bytes a level (memo references)."""
    out = pickle.BINUNICODE + struct.pack("<I", leaf) + b"x" * leaf + pickle.BINPUT + b"\x00" + pickle.POP
    for level in range(1, levels + 1):
        out += (
            pickle.EMPTY_LIST
            + pickle.MARK
            + (pickle.BINGET + bytes([level - 1])) * width
            + pickle.APPENDS
            + pickle.BINPUT
            + bytes([level])
            + (pickle.POP if level < levels else b"")
        )
    return out


def builtin_call(name, args, count):
    """A protocol-2 pickle calling builtins.<name> on the `count` values `args` leaves on the stack."""
    return (
        b"\x80\x02"
        + pickle.GLOBAL
        + b"__builtin__\n"
        + name
        + b"\n"
        + args
        + {1: pickle.TUPLE1, 2: pickle.TUPLE2}[count]
        + pickle.REDUCE
        + pickle.STOP
    )


HOSTILE_PICKLES = {
    # 311 bytes that ask str() for a 1 GB repr (checked only after it was built)
    "str_of_a_gigabyte": builtin_call(b"str", shared_lists(7), 1),
    # 415 bytes asking for a terabyte
    "str_of_a_terabyte": builtin_call(b"str", shared_lists(11), 1),
    # a refused call whose arguments were formatted in full for the message (a terabyte)
    "refused_call_with_huge_args": builtin_call(b"int", shared_lists(11) + pickle.BINGET + b"\x0b", 2),
    # 4 MiB of EMPTY_SET: one 216-byte set per byte
    "empty_sets": b"\x80\x04" + pickle.EMPTY_SET * (4 << 20) + pickle.STOP,
    # 4 MiB of MARK (a list each) and of MEMOIZE (a memo entry each)
    "marks": b"\x80\x04" + pickle.MARK * (4 << 20) + pickle.STOP,
    "memo_entries": b"\x80\x04" + pickle.NONE + pickle.MEMOIZE * (4 << 20) + pickle.STOP,
}

HOSTILE_JSON = {
    "empty_objects": b"[" + b"{}," * (25 * 10**6 // 3) + b"{}]",  # 25 MB: 8 M dicts
    "empty_arrays": b"[" + b"[]," * (25 * 10**6 // 3) + b"[]]",  # 25 MB: 8 M lists
}

_LOAD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from ddpwatch.format import documents
from ddpwatch.sources import flight_recorder_files
start = time.perf_counter()
try:
    (documents.load_document if sys.argv[1] == "json" else flight_recorder_files.load_dump)(sys.argv[2])
    error = None
except BaseException as exc:
    error = f"{{type(exc).__name__}}: {{exc}}"
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec, so a parent holding torch (300 MiB) would lift
# every child's figure; the high-water mark of this process's own memory starts anew at exec.
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({{"error": error, "s": time.perf_counter() - start, "peak_mib": peak_kib / 1024}}))
"""


def load_in_a_subprocess(kind, path):
    """(error or None, peak RSS in MiB) of loading path as ddpwatch does, under a 2 GiB address-space limit."""
    done = subprocess.run(
        [sys.executable, "-c", _LOAD.format(limit=ADDRESS_LIMIT), kind, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    return result["error"], result["peak_mib"]


@pytest.mark.real
@pytest.mark.parametrize("name", ["str_of_a_gigabyte", "str_of_a_terabyte", "refused_call_with_huge_args"])
def test_an_allowed_call_is_refused_before_it_builds_something_huge(tmp_path, name):
    path = tmp_path / "fr_trace_0"
    path.write_bytes(HOSTILE_PICKLES[name])
    error, peak_mib = load_in_a_subprocess("pickle", path)
    call = "int(a list of 10 items, a list of 10 items)" if name.startswith("refused") else "str(a list of 10 items)"
    assert f"refused {call}" in error and len(error) < 400, error[:1000]
    assert peak_mib < 200, (peak_mib, error[:300])


@pytest.mark.real
@pytest.mark.parametrize("name", ["empty_sets", "marks", "memo_entries"])
def test_four_mib_of_one_byte_opcodes_stop_at_the_budget(tmp_path, name):
    path = tmp_path / "fr_trace_0"
    path.write_bytes(HOSTILE_PICKLES[name])
    error, peak_mib = load_in_a_subprocess("pickle", path)
    budget_mib = (
        bounded.Budget("", len(HOSTILE_PICKLES[name]), fr_files.PICKLE_BUILT_CAP, fr_files.PICKLE_BUILT_PER_BYTE).limit
        / 2**20
    )
    assert "would build more than" in error, error[:1000]
    assert peak_mib < budget_mib + 150, (peak_mib, budget_mib)  # the sets built until then, and the interpreter


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(HOSTILE_JSON))
def test_25_mb_of_empty_json_containers_are_refused_before_parsing(tmp_path, name):
    path = tmp_path / "report.json"
    path.write_bytes(HOSTILE_JSON[name])
    error, peak_mib = load_in_a_subprocess("json", path)
    assert "would build more than" in error, error[:1000]
    assert peak_mib < 150, peak_mib  # the 25 MB read, nothing parsed


@pytest.mark.real
def test_the_budget_error_reaches_the_command_as_one_line(tmp_path):
    path = tmp_path / "report.json"
    path.write_bytes(HOSTILE_JSON["empty_objects"])
    assert_one_line_error(report_cli(path), "would build more than")


# ---------------------------------------------------------------- what is legitimate still loads, floor aside


@pytest.fixture
def no_floor(monkeypatch):
    """Budgets from the per-byte allowance alone: what a file the size of a real large one would get."""
    monkeypatch.setattr(bounded, "BUILT_FLOOR", 0)


def test_ddpwatch_documents_load_within_the_per_byte_allowance(tmp_path, no_floor):
    documents.load_incident(str(_written(tmp_path / "report.json", seed_incident())))
    dense = {str(group): list(range(16384)) for group in range(8)}  # rank numbers: the densest legitimate JSON
    rank_lists = dict(seed_states(2)[0], world_size=16384, groups=dense)
    documents.load_document(str(_written(tmp_path / "rank-0.json", rank_lists)))
    with pytest.raises(bounded.OverBudget):
        bounded.loads(b"[" + b"{}," * 1000 + b"{}]", "x")


def test_flight_recorder_dumps_load_within_the_per_byte_allowance(tmp_path, no_floor):
    for kind in ("pickle", "json"):
        folder = write_dumps(tmp_path / kind, seed_dumps(), kind)
        assert fr_files.load_dump(str(folder / "fr_trace_0"))["entries"]
    with pytest.raises(bounded.OverBudget):
        fr_files.safe_unpickle(b"\x80\x04" + pickle.EMPTY_SET * 1000 + pickle.STOP)


def _written(path, doc):
    path.write_text(json.dumps(doc))
    return path


TORCH_DUMP = """
import os, sys
os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
import torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
for _ in range(2010):
    dist.all_reduce(torch.ones(4))
data = torch._C._distributed_c10d._dump_fr_trace()
dist.destroy_process_group()
open(sys.argv[1], "wb").write(data)
"""


@pytest.mark.real
@pytest.mark.timeout(180)
def test_torchs_own_2000_entry_dump_loads_within_the_per_byte_allowance(tmp_path, no_floor):
    """The calibration of PICKLE_BUILT_PER_BYTE: torch's own dump, frames and all, from the per-byte part alone."""
    pytest.importorskip("torch")
    from ddpwatch.launch import free_port

    path = tmp_path / "fr_trace_0"
    subprocess.run(
        [sys.executable, "-c", TORCH_DUMP, str(path), str(free_port())], check=True, timeout=150, capture_output=True
    )
    assert len(fr_files.load_dump(str(path))["entries"]) == 2000
