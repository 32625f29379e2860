"""In-process tests of the guard on a 1-rank gloo group: what it records, and that it restores everything."""

import datetime
import os
import threading

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import ddpwatch
from ddpwatch import session as session_module
from ddpwatch.launch import free_port


def _line_of(marker):
    with open(__file__) as handle:
        return next(number for number, line in enumerate(handle, 1) if marker in line and "_line_of" not in line)


def test_records_collectives_with_the_user_line_and_per_group_sequence(one_rank_group):
    originals = (dist.all_reduce, c10d.all_reduce, dist.barrier, dist._broadcast_coalesced)
    with ddpwatch.guard(interval=0.2) as session:
        one_rank_group()
        assert dist.all_reduce is c10d.all_reduce is not originals[0]
        dist.all_reduce(torch.ones(3))  # MARK-ALL-REDUCE
        work = dist.broadcast(torch.ones(2, 2), src=0, async_op=True)
        work.wait()
        dist.broadcast_object_list([{"a": 1}], src=0)  # MARK-OBJECT
        dist.barrier()
        session.recorder.poll_pending()  # what the watchdog does each round: async ops complete through their Work
        snap = session.recorder.snapshot(recent=50)
        assert session.watchdog is not None and session.watchdog.is_alive()
    records = snap["recent"]
    first = records[0]
    assert (first["op"], first["api"], first["seq"], first["group"]) == ("all_reduce", "all_reduce", 0, "0")
    assert first["shapes"] == [[3]] and first["dtypes"] == ["float32"]
    assert first["site"]["line"] == _line_of("MARK-ALL-REDUCE") and first["site"]["file"] == __file__
    assert [r["seq"] for r in records] == list(range(len(records)))
    object_records = [r for r in records if r["region"] and r["region"]["kind"] == "object_collective"]
    assert object_records and all(r["region"]["site"]["line"] == _line_of("MARK-OBJECT") for r in object_records)
    assert snap["inflight"] == [] and all(r["state"] == "completed" for r in records)
    # restored on exit
    assert (dist.all_reduce, c10d.all_reduce, dist.barrier, dist._broadcast_coalesced) == originals


def test_ddp_forward_is_a_region_and_patches_are_restored_after_an_exception(one_rank_group):
    forward = torch.nn.parallel.DistributedDataParallel.forward
    rebuild = dist.Reducer._rebuild_buckets
    with pytest.raises(KeyError):
        with ddpwatch.guard() as session:
            one_rank_group()
            model = torch.nn.parallel.DistributedDataParallel(
                torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
            )
            model(torch.randn(8, 4)).sum().backward()
            model(torch.randn(8, 4))  # MARK-DDP
            snap = session.recorder.snapshot(recent=50)
            raise KeyError("user error")
    ddp_records = [r for r in snap["recent"] if r["region"] and r["region"]["kind"] == "ddp_forward"]
    assert {r["api"] for r in ddp_records} >= {"_broadcast_coalesced", "Reducer._rebuild_buckets"}
    assert any(r["region"]["site"]["line"] == _line_of("MARK-DDP") for r in ddp_records)
    assert torch.nn.parallel.DistributedDataParallel.forward is forward
    assert dist.Reducer._rebuild_buckets is rebuild
    assert session_module.current() is None


def test_user_errors_from_collectives_propagate_unchanged(one_rank_group):
    with ddpwatch.guard():
        one_rank_group()
        with pytest.raises(Exception) as caught:
            dist.broadcast(torch.ones(1), src=5)
        with pytest.raises(Exception) as plain:
            dist.broadcast.__ddpwatch_original__(torch.ones(1), src=5)
    assert type(caught.value) is type(plain.value) and str(caught.value) == str(plain.value)
    assert "invalid root rank" in str(caught.value)


def test_nested_guards_share_one_session_and_the_last_exit_restores(one_rank_group):
    original = dist.all_reduce
    with ddpwatch.guard() as outer:
        with ddpwatch.guard() as inner:
            assert inner is outer
        assert dist.all_reduce is not original
    assert dist.all_reduce is original
    assert not [t for t in threading.enumerate() if t.name.startswith("ddpwatch")]


def test_bad_configuration_fails_before_anything_is_patched():
    original = dist.all_reduce
    with pytest.raises(ddpwatch.ConfigError, match="explode.*action.*report or abort"):
        with ddpwatch.guard(action="explode"):
            pass
    assert dist.all_reduce is original and session_module.current() is None


def test_destroy_inside_the_guard_stops_the_watchdog_and_init_again_rearms(one_rank_group):
    with ddpwatch.guard(interval=0.2) as session:
        one_rank_group()
        first = session.watchdog
        dist.destroy_process_group()
        assert session.watchdog is None and not first.is_alive()
        store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        assert session.watchdog is not None and session.watchdog.is_alive()
        dist.all_reduce(torch.ones(1))


def test_collectives_from_a_second_thread_and_async_ops_are_recorded(one_rank_group):
    with ddpwatch.guard(interval=0.2) as session:
        one_rank_group()
        work = dist.all_reduce(torch.ones(2), async_op=True)
        pending = [r for r in session.recorder.inflight.values() if r.op == "all_reduce"]
        work.wait()
        worker = threading.Thread(target=lambda: dist.broadcast(torch.ones(1), src=0), name="side-thread")
        worker.start()
        worker.join(10)
        session.recorder.poll_pending()
        snap = session.recorder.snapshot(recent=10)
    assert len(pending) == 1  # "in flight" until the Work completes, not until the call returns
    assert snap["inflight"] == []
    assert [(r["op"], r["thread"]) for r in snap["recent"]] == [
        ("all_reduce", "MainThread"),
        ("broadcast", "side-thread"),
    ]
    assert [r["seq"] for r in snap["recent"]] == [0, 1]


def test_tens_of_thousands_of_ops_keep_memory_bounded(one_rank_group):
    import tracemalloc

    with ddpwatch.guard(ring_size=512) as session:
        one_rank_group()
        value = torch.ones(1)
        for _ in range(2000):
            dist.all_reduce(value)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(30_000):
            dist.all_reduce(value)
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        recorder = session.recorder
        assert len(recorder.ring) == 512 and not recorder.inflight
        assert recorder.last_seq["0"] == 32_000 - 1
        seqs = [r.seq for r in recorder.ring]
        assert seqs == list(range(32_000 - 512, 32_000))  # no record lost or corrupted at the end of the ring
    assert grown < 2 * 2**20, f"memory grew by {grown} bytes over 30,000 ops"


@pytest.mark.real
def test_py_spy_missing_or_refused_is_one_line_and_python_stacks_remain(monkeypatch, tmp_path):
    from ddpwatch.watch import evidence

    monkeypatch.setattr(evidence.shutil, "which", lambda name: None)
    missing = evidence.native_stacks(os.getpid())
    assert missing == {"unavailable": "py-spy is not installed (pip install py-spy); Python stacks only"}
    fake = tmp_path / "py-spy"
    fake.write_text(
        "#!/bin/sh\necho 'Error: Permission Denied: try running again with elevated permissions' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(evidence.shutil, "which", lambda name: str(fake))
    refused = evidence.native_stacks(os.getpid())
    assert "Permission Denied" in refused["unavailable"] and "SYS_PTRACE" in refused["unavailable"]
    assert "\n" not in refused["unavailable"]


def test_a_failed_start_leaves_nothing_patched_and_no_session(monkeypatch):
    import torch.distributed as dist
    from ddpwatch.capture import wrappers

    before = (dist.all_reduce, dist.init_process_group, dist.destroy_process_group)

    def broken(self, dist_module):
        raise RuntimeError("a torch whose DDP internals moved")

    monkeypatch.setattr(wrappers.Patcher, "_patch_ddp_internals", broken)
    with pytest.raises(RuntimeError, match="internals moved"):
        ddpwatch.install()
    assert session_module.current() is None
    assert (dist.all_reduce, dist.init_process_group, dist.destroy_process_group) == before
    monkeypatch.undo()
    session = ddpwatch.install()  # the next install is a whole one, not the half-started session
    try:
        assert session.patcher.active and dist.all_reduce is not before[0]
        assert hasattr(dist.init_process_group, "__ddpwatch_original__")  # lifecycle wrappers carry the marker
    finally:
        ddpwatch.uninstall()
    assert (dist.all_reduce, dist.init_process_group, dist.destroy_process_group) == before


def test_guard_takes_dir_like_the_option(tmp_path):
    with ddpwatch.guard(dir=str(tmp_path / "reports")) as session:
        assert session.config.dir == str(tmp_path / "reports")


def test_guard_still_takes_report_dir_with_a_deprecation_warning(tmp_path):
    with pytest.warns(DeprecationWarning, match="dir="):
        with ddpwatch.guard(report_dir=str(tmp_path / "old")) as session:
            assert session.config.dir == str(tmp_path / "old")
    with pytest.raises(TypeError):
        with ddpwatch.guard(dir=str(tmp_path), report_dir=str(tmp_path)):
            pass


FSDP2_LATER = """
import sys, torch, torch.distributed as dist, ddpwatch
dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1)
with ddpwatch.guard():
    dist.all_reduce(torch.ones(1))
    print("IMPORTED-AT-START", sorted(m for m in ("torch.distributed.fsdp", "sympy") if m in sys.modules))
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    print("PATCHED-AT-IMPORT", hasattr(FSDPState._pre_forward, "__ddpwatch_original__"))
print("RESTORED", not hasattr(FSDPState._pre_forward, "__ddpwatch_original__"))
dist.destroy_process_group()
"""


@pytest.mark.real
@pytest.mark.timeout(60)
def test_the_guard_imports_no_fsdp2_and_patches_it_when_the_program_does(tmp_path):
    # Before: guard() imported FSDP2 to patch it (DTensor, sympy, dynamo: 0.6 s of CPU on every rank of every job).
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FSDP2_LATER, f"file://{tmp_path}/store"],
        capture_output=True,
        text=True,
        timeout=50,
        start_new_session=True,
        env=dict(os.environ, DDPWATCH_DIR=str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "IMPORTED-AT-START []" in done.stdout, done.stdout
    assert "PATCHED-AT-IMPORT True" in done.stdout and "RESTORED True" in done.stdout, done.stdout


def test_an_op_whose_call_returned_pending_says_so_until_someone_waits_on_it(one_rank_group):
    # async_op=True and a functional collective return with the op pending: the rank is free to be anywhere, and
    # the analysis must not read it as waiting there (a first DTensor call imported for seconds meanwhile)
    import torch.distributed._functional_collectives as funcol

    with ddpwatch.guard(interval=0.2) as session:
        one_rank_group()
        work = dist.all_reduce(torch.ones(2), async_op=True)
        total = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
        pending = session.recorder.snapshot(recent=0)["inflight"]
        work.wait()
        total.wait()
        session.recorder.poll_pending()
        done = session.recorder.snapshot(recent=10)
        sync = dist.all_reduce(torch.ones(1))  # a synchronous call: never marked
        after = session.recorder.snapshot(recent=10)
    marks = {r["api"]: (r.get("async"), r.get("waited")) for r in pending}
    assert marks.get("all_reduce", (True, False)) == (True, False), pending  # gloo may have finished it already
    assert marks["funcol.all_reduce"] == (True, False), pending
    assert done["inflight"] == []
    assert sync is None and "async" not in after["recent"][-1], after["recent"][-1]
