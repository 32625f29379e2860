"""Flight Recorder dumps -> ddpwatch verdicts: hand-built dumps (fast, no torch) and one real 2-rank gloo run."""

import json
import os
import pickle
import sys
import time

import pytest

from ddpwatch import cli
from ddpwatch.format import build
from ddpwatch.format.version import FormatError
from ddpwatch.sources import flight_recorder as fr, flight_recorder_files as fr_files

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH = "/venv/lib/python3.11/site-packages/torch"
USER = "/home/u/train.py"
NOW_NS = 1_796_219_199_000_000_000


# ---------------------------------------------------------------- hand-built dumps shaped like torch 2.13's (gloo)


def frame(name, filename, line):
    return {"name": name, "filename": filename, "line": line}


DDP_BUFFER_SYNC = [  # innermost first, as FR writes them
    frame("_distributed_broadcast_coalesced", f"{TORCH}/nn/parallel/distributed.py", 2363),
    frame("_default_broadcast_coalesced", f"{TORCH}/nn/parallel/distributed.py", 2451),
    frame("_sync_module_buffers", f"{TORCH}/nn/parallel/distributed.py", 2429),
    frame("_sync_buffers", f"{TORCH}/nn/parallel/distributed.py", 2425),
    frame("_pre_forward", f"{TORCH}/nn/parallel/distributed.py", 1782),
    frame("forward", f"{TORCH}/nn/parallel/distributed.py", 1886),
    frame("_call_impl", f"{TORCH}/nn/modules/module.py", 1789),
    frame("_wrapped_call_impl", f"{TORCH}/nn/modules/module.py", 1778),
    frame("validate", USER, 42),
    frame("<module>", USER, 99),
]


def barrier_frames(line):
    return [
        frame("barrier", f"{TORCH}/distributed/distributed_c10d.py", 5349),
        frame("wrapper", f"{TORCH}/distributed/c10d_logger.py", 83),
        frame("train", USER, line),
        frame("<module>", USER, 99),
    ]


def entry(seq, op, frames=(), retired=True, sizes=(), dtypes=(), age_s=30.0, group=("0", "default_pg")):
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": group,
        "thread_name": "python",
        "thread_id": "1",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"gloo:{op}",
        "time_created_ns": NOW_NS - int(age_s * 1e9),
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": list(dtypes),
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": list(dtypes),
        "state": "scheduled",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": retired,
        "timeout_ms": 1800000,
        "is_p2p": False,
        "frames": list(frames),
    }


def dump(entries, world_size=2):
    last_done = max((e["collective_seq_id"] for e in entries if e["retired"]), default=-1)
    return {
        "version": "2.10",
        "comm_lib_version": "",
        # gloo's quirk: the default group sits under an empty-string key (torch's own analyzer crashes on it).
        "pg_config": {"": {"name": "", "desc": "", "ranks": json.dumps(list(range(world_size)))}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": max(e["collective_seq_id"] for e in entries),
                "last_started_collective": -1,
                "last_completed_collective": last_done,
            }
        },
        "entries": entries,
    }


def seed_dumps(world_size=2):
    """Rank 0 blocks in DDP's buffer broadcast (2 buckets) at train.py:42; the others wait in a barrier."""
    history = [entry(1, "barrier", barrier_frames(80)), entry(2, "all_reduce", sizes=[(28,)], dtypes=["Float"])]
    dumps = {
        0: dump(
            history
            + [
                entry(3, "broadcast", DDP_BUFFER_SYNC, retired=False, sizes=[(8,)], dtypes=["Float"], age_s=3.0),
                entry(4, "broadcast", DDP_BUFFER_SYNC, retired=False, sizes=[(1,)], dtypes=["Long"], age_s=3.0),
            ],
            world_size,
        )
    }
    for rank in range(1, world_size):
        dumps[rank] = dump(history + [entry(3, "barrier", barrier_frames(88), retired=False, age_s=3.0)], world_size)
    return dumps


def without_completion_marks(d):
    """A dump as older torch versions write it: no `retired`, no `pg_status` (the heuristic's case)."""
    d = json.loads(json.dumps(d))
    d.pop("pg_status")
    for e in d["entries"]:
        e.pop("retired")
    return d


def write_dumps(folder, dumps, kind="pickle", prefix="fr_trace_"):
    folder.mkdir(parents=True, exist_ok=True)
    for rank, d in dumps.items():
        path = folder / f"{prefix}{rank}"
        path.write_bytes(pickle.dumps(d, protocol=2) if kind == "pickle" else json.dumps(d).encode())
        os.utime(path, (NOW_NS / 1e9, NOW_NS / 1e9))  # the dump time is the file's mtime
    return folder


def report_json(capsys, *argv):
    assert cli.main(["report", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------- fast tests


@pytest.mark.parametrize("kind", ["pickle", "json"])
def test_seed_stall_dump_names_rank0_and_ddp_forward(tmp_path, capsys, kind):
    incident = report_json(capsys, "--flight-recorder", str(write_dumps(tmp_path / "fr", seed_dumps(), kind)))
    [finding] = incident["findings"]
    assert finding["kind"] == "ddp_forward_on_subset"
    assert finding["ranks"] == [0]  # torch's analyzer blames rank 1 here
    assert finding["location"] == {"file": USER, "line": 42, "function": "validate"}
    assert finding["evidence"]["ddp_op"] == "buffer_broadcast"
    assert incident["trigger"] == "deadlock" and incident["written_by"] is None
    assert incident["source"]["kind"] == "flight_recorder" and len(incident["source"]["files"]) == 2
    rank0, rank1 = incident["ranks"]
    assert [(r["seq"], r["op"], r["api"]) for r in rank0["inflight"]] == [
        (3, "broadcast", "_broadcast_coalesced"),
        (4, "broadcast", "_broadcast_coalesced"),
    ]
    assert rank0["inflight"][0]["dtypes"] == ["float32"] and rank0["inflight"][0]["shapes"] == [[8]]
    assert [(r["seq"], r["op"]) for r in rank1["inflight"]] == [(3, "barrier")]
    assert rank0["source"]["in_flight_rule"] == "torch_completion_marks"
    assert rank0["stacks"][0]["frames"][-1]["function"] == "_distributed_broadcast_coalesced"  # innermost last
    assert [f["internal"] for f in rank0["stacks"][0]["frames"]][:2] == [False, False]


def test_without_completion_marks_the_last_unmatched_heuristic_decides(tmp_path, capsys):
    dumps = {rank: without_completion_marks(d) for rank, d in seed_dumps(3).items()}
    incident = report_json(capsys, "--flight-recorder", str(write_dumps(tmp_path / "fr", dumps, "json")))
    [finding] = incident["findings"]
    assert (finding["kind"], finding["ranks"]) == ("ddp_forward_on_subset", [0])
    rank0, rank1, _ = incident["ranks"]
    assert rank0["source"]["in_flight_rule"] == "unmatched_tail_heuristic"
    # In flight: what not every member issued alike. Rank 0's seq 3-4 (broadcasts nobody else issued), rank 1's
    # seq 3 (rank 0 issued a broadcast there, not a barrier). Seq 1-2 every rank issued alike: completed.
    assert [r["seq"] for r in rank0["inflight"]] == [3, 4]
    assert [r["seq"] for r in rank1["inflight"]] == [3]
    assert [r["seq"] for r in rank1["recent"]] == [1, 2]


def test_heuristic_ignores_positions_a_peer_ring_buffer_no_longer_holds():
    dumps = {rank: without_completion_marks(d) for rank, d in seed_dumps().items()}
    dumps[1]["entries"] = dumps[1]["entries"][1:]  # rank 1's ring dropped its oldest entry (seq 1)
    states, _ = _states({r: (d, f"/x/fr_{r}") for r, d in dumps.items()})
    assert [r["seq"] for r in states[0]["recent"]] == [1, 2]
    assert [r["seq"] for r in states[0]["inflight"]] == [3, 4]


def test_heuristic_counts_a_last_op_matched_by_all_as_completed():
    history = [entry(1, "barrier", barrier_frames(80)), entry(2, "all_reduce")]
    chosen = {r: (without_completion_marks(dump(history)), f"/x/fr_{r}") for r in range(2)}
    states, world_size = _states(chosen)
    assert world_size == 2
    assert all(not s["inflight"] for s in states.values())


def _states(chosen):
    real_mtime = os.path.getmtime
    os.path.getmtime = lambda path: NOW_NS / 1e9
    try:
        return fr.states_from_dumps(chosen)
    finally:
        os.path.getmtime = real_mtime


def test_json_dump_without_frames_still_blames_rank0(tmp_path, capsys):
    dumps = seed_dumps()
    for d in dumps.values():
        for e in d["entries"]:
            e.pop("frames", None)  # _dump_fr_trace_json() writes no stacks
    incident = report_json(capsys, "--flight-recorder", str(write_dumps(tmp_path / "fr", dumps, "json")))
    [finding] = incident["findings"]
    assert finding["kind"] == "collective_on_subset" and finding["ranks"] == [0]


def test_pickle_beats_json_for_the_same_rank_and_other_files_are_ignored(tmp_path):
    folder = tmp_path / "fr"
    write_dumps(folder, seed_dumps(), "pickle", prefix="fr_trace_")
    json_only = {r: json.loads(json.dumps(d)) for r, d in seed_dumps().items()}
    for d in json_only.values():
        for e in d["entries"]:
            e.pop("frames", None)
    write_dumps(folder, json_only, "json", prefix="fr_json_")
    (folder / "notes.txt").write_text("not a dump")
    (folder / "log.1").write_text("not a dump either, though named like one")
    chosen = fr_files.find_dumps([str(folder)])
    assert {rank: os.path.basename(path) for rank, (_, path) in chosen.items()} == {0: "fr_trace_0", 1: "fr_trace_1"}


def test_two_dumps_of_one_kind_for_a_rank_is_an_error(tmp_path, capsys):
    write_dumps(tmp_path / "a", seed_dumps())
    write_dumps(tmp_path / "b", seed_dumps())
    assert cli.main(["report", "--flight-recorder", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpwatch report: two Flight Recorder dumps for rank 0") and err.count("\n") == 1


def test_dumps_spread_over_two_host_folders_merge(tmp_path, capsys):
    dumps = seed_dumps()
    write_dumps(tmp_path / "host0", {0: dumps[0]})
    write_dumps(tmp_path / "host1", {1: dumps[1]})
    incident = report_json(
        capsys, "--flight-recorder", str(tmp_path / "host0"), "--flight-recorder", str(tmp_path / "host1")
    )
    assert [(f["kind"], f["ranks"]) for f in incident["findings"]] == [("ddp_forward_on_subset", [0])]


def test_a_damaged_dump_is_an_error_not_a_missing_rank(tmp_path, capsys):
    folder = write_dumps(tmp_path / "fr", seed_dumps())
    data = (folder / "fr_trace_1").read_bytes()
    (folder / "fr_trace_1").write_bytes(data[: len(data) // 2])  # the rank died while writing it
    assert cli.main(["report", "--flight-recorder", str(folder)]) == 2
    assert "fr_trace_1: unreadable Flight Recorder dump" in capsys.readouterr().err


@pytest.mark.parametrize("keep", [0.5, 0.9, -1])
def test_a_truncated_dump_says_so_never_an_empty_reason(tmp_path, capsys, keep):
    """Issue 27: a truncated pickle gave "unreadable Flight Recorder dump ()" (EOFError() has no message)."""
    folder = write_dumps(tmp_path / "fr", seed_dumps())
    data = (folder / "fr_trace_1").read_bytes()
    (folder / "fr_trace_1").write_bytes(data[: int(len(data) * keep)] if keep > 0 else data[:keep])
    assert cli.main(["report", "--flight-recorder", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "fr_trace_1: unreadable Flight Recorder dump (it ends early (truncated" in err and "()" not in err, err


def test_no_dumps_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "readme.txt").write_text("hello")
    assert cli.main(["report", "--flight-recorder", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("ddpwatch report: no Flight Recorder dump")
    assert cli.main(["report", "--flight-recorder", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo owned > /dev/null",))


def test_a_pickle_that_names_a_callable_is_refused(tmp_path):
    path = tmp_path / "fr_trace_0"
    path.write_bytes(pickle.dumps({"entries": [_Evil()], "version": "2.10"}, protocol=2))
    with pytest.raises(fr_files.FlightRecorderError, match="refused to load (posix|os|nt).system"):
        fr_files.load_dump(str(path))
    with pytest.raises(pickle.UnpicklingError):
        fr_files.safe_unpickle(pickle.dumps(FormatError("x")))


def test_safe_unpickle_reads_plain_data():
    data = {"a": [1, 2.5, None, True, ("x", b"y")], "s": {1, 2}, "f": frozenset({3})}
    assert fr_files.safe_unpickle(pickle.dumps(data, protocol=2)) == data
    assert fr_files.safe_unpickle(pickle.dumps(data, protocol=5)) == data


@pytest.mark.parametrize(
    "name, expected",
    [
        ("gloo:broadcast", ("broadcast", None)),
        ("nccl:all_reduce", ("all_reduce", None)),
        ("nccl:_allgather_base", ("all_gather", None)),
        ("nccl:_reduce_scatter_base", ("reduce_scatter", None)),
        ("nccl:send 0->1", ("send", (0, 1))),
        ("gloo:barrier", ("barrier", None)),
        (None, ("?", None)),
    ],
)
def test_canonical_op(name, expected):
    assert fr.canonical_op(name) == expected


@pytest.mark.parametrize(
    "path, internal",
    [
        ("/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", True),
        ("/src/pytorch/torch/distributed/c10d_logger.py", True),
        ("/usr/lib/python3.11/threading.py", True),
        ("<frozen runpy>", True),
        ("/opt/proj/ddpwatch/cli.py", True),
        ("/opt/proj/ddpwatch/capture/wrappers.py", True),
        ("<ddpwatch hot path: all_reduce>", True),
        ("/opt/proj/ddpwatch/examples/seed_stall.py", False),
        ("/home/u/train.py", False),
        ("/home/u/torch/train.py", False),
        ("/venv/lib/python3.11/site-packages/lightning/trainer.py", True),  # library code, as live: not the user's line
        ("/usr/lib/python3/dist-packages/accelerate/state.py", True),
    ],
)
def test_internal_frames_are_told_by_path_text(path, internal):
    """A dump's frames are classified by their path text alone (frames.DUMPED): it may come from another machine."""
    assert fr._frame({"filename": path, "line": 1, "name": "f"})["internal"] is internal


def test_gradient_all_reduce_and_bucket_rebuild_are_named():
    backward = [
        frame("_engine_run_backward", f"{TORCH}/autograd/graph.py", 979),
        frame("backward", f"{TORCH}/_tensor.py", 623),
        frame("train", USER, 70),
    ]
    assert fr.classify([fr._frame(f) for f in backward], "all_reduce") == (build.DDP_GRAD_ALLREDUCE, None)
    rebuild = [frame("_pre_forward", f"{TORCH}/nn/parallel/distributed.py", 1775)] + DDP_BUFFER_SYNC[5:]
    api, region = fr.classify([fr._frame(f) for f in rebuild], "broadcast")
    assert api == build.DDP_BUCKET_REBUILD and region["kind"] == build.DDP_FORWARD and region["site"]["line"] == 42


# ---------------------------------------------------------------- the real thing: torch's own dumps, gloo, 2 ranks

SEED_WITHOUT_DDPWATCH = """
import datetime, os, sys, threading, time
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

OUT = sys.argv[1]


def write(kind, data):
    folder = os.path.join(OUT, kind)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "fr_trace_%d" % dist.get_rank())
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
    os.rename(path + ".tmp", path)


def dump_then_exit(after_s):
    time.sleep(after_s)
    write("pickle", torch._C._distributed_c10d._dump_fr_trace())
    write("json", torch._C._distributed_c10d._dump_fr_trace_json())
    # Leave only when every rank has dumped: a peer that exits first closes the sockets under the others.
    deadline = time.time() + 20
    while time.time() < deadline and len(os.listdir(os.path.join(OUT, "pickle"))) < dist.get_world_size():
        time.sleep(0.05)
    os._exit(0)


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(8, 4)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dist.barrier()
    threading.Thread(target=dump_then_exit, args=(3.0,), daemon=True).start()
    try:
        if dist.get_rank() == 0:
            with torch.no_grad():
                model(torch.randn(8, 4))  # LINE:ddp_call
        dist.barrier()  # LINE:barrier
    except Exception:
        time.sleep(30)  # a peer that has dumped left first: this rank's dumper thread ends the process


main()
"""


def _tagged(path, tag):
    with open(path) as handle:
        return next(n for n, line in enumerate(handle, 1) if f"# LINE:{tag}" in line)


@pytest.mark.real
@pytest.mark.timeout(150)
def test_real_gloo_seed_stall_dumps_name_rank0(tmp_path, capsys):
    pytest.importorskip("torch")
    from ddpwatch.launch import run_ranks

    script = tmp_path / "seed_without_ddpwatch.py"
    script.write_text(SEED_WITHOUT_DDPWATCH)
    out = tmp_path / "dumps"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPWATCH")}
    env.update(TORCH_FR_BUFFER_SIZE="2000", PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    started = time.monotonic()
    results = run_ranks([sys.executable, str(script), str(out)], 2, env=env, timeout=90, cwd=str(tmp_path))
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    assert time.monotonic() - started < 90

    # The format this reader relies on, checked on torch's real output (a torch upgrade that moves it fails here).
    raw = fr_files.load_dump(str(out / "pickle" / "fr_trace_0"))
    assert {"version", "pg_config", "pg_status", "entries"} <= set(raw)
    assert "" in raw["pg_config"]  # gloo's empty-string key
    last = raw["entries"][-1]
    assert {
        "collective_seq_id",
        "process_group",
        "profiling_name",
        "input_sizes",
        "input_dtypes",
        "frames",
        "state",
        "retired",
        "time_created_ns",
        "is_p2p",
        "record_id",
    } <= set(last)
    assert last["profiling_name"] == "gloo:broadcast" and last["state"] == "scheduled"
    assert any(f["name"] == "_sync_buffers" for f in last["frames"])

    incident = report_json(capsys, "--flight-recorder", str(out / "pickle"))
    [finding] = incident["findings"]
    assert (finding["kind"], finding["ranks"]) == ("ddp_forward_on_subset", [0])
    assert finding["location"]["line"] == _tagged(script, "ddp_call")
    assert os.path.samefile(finding["location"]["file"], script)
    assert finding["evidence"]["ddp_op"] == "buffer_broadcast"
    waiting = [row for row in finding["evidence"]["mismatched"] if row["ranks"] == [1]]
    assert waiting[0]["op"] == "barrier" and waiting[0]["site"]["line"] == _tagged(script, "barrier")

    # The JSON dumps carry no frames: no DDP region to see, yet the odd rank out is still rank 0.
    incident = report_json(capsys, "--flight-recorder", str(out / "json"))
    assert [f["ranks"] for f in incident["findings"]] == [[0]]

    # And the text report leads with the verdict.
    assert cli.main(["report", "--flight-recorder", str(out / "pickle")]) == 0
    text = capsys.readouterr().out
    assert f"[ddp_forward_on_subset] culprit: rank 0 at {script.name}:{_tagged(script, 'ddp_call')}" in text


LIGHTNING_STRATEGY = "/venv/lib/python3.11/site-packages/lightning/pytorch/strategies/ddp.py"
MYLAB_LOOP = "/venv/lib/python3.11/site-packages/mylab/loop.py"


def through(library_file):
    """A barrier the user's train.py reached through an installed package's function (innermost first)."""
    return [
        frame("barrier", f"{TORCH}/distributed/distributed_c10d.py", 5349),
        frame("barrier", library_file, 303),
        frame("train", USER, 42),
        frame("<module>", USER, 99),
    ]


def test_a_library_frame_is_not_the_users_line_offline_as_live():
    record = fr._record(entry(1, "barrier", through(LIGHTNING_STRATEGY)), 0, NOW_NS / 1e9)
    assert (record["site"]["file"], record["site"]["line"]) == (USER, 42)
    assert [f.get("library", False) for f in record["fr"]["frames"]] == [False, True, False, False]


def test_user_packages_are_honoured_offline_where_the_setting_is_known():
    from ddpwatch import frames

    assert fr._record(entry(1, "barrier", through(MYLAB_LOOP)), 0, NOW_NS / 1e9)["site"]["file"] == USER
    mine = frames.packages(user=("mylab",))
    record = fr._record(entry(1, "barrier", through(MYLAB_LOOP)), 0, NOW_NS / 1e9, mine)
    assert (record["site"]["file"], record["site"]["line"]) == (MYLAB_LOOP, 303)


def mylab_dumps():
    """Both ranks blocked at a barrier they reached through mylab (an installed package), at different lines."""
    return {
        rank: dump(
            [
                entry(1, "all_reduce", sizes=[(1,)], dtypes=["Float"]),
                entry(
                    2, "barrier", through(MYLAB_LOOP)[:2] + [frame("train", USER, 40 + rank)], retired=False, age_s=3.0
                ),
            ]
        )
        for rank in range(2)
    }


def test_report_from_flight_recorder_dumps_reads_user_packages_from_the_configuration(tmp_path, capsys, monkeypatch):
    folder = str(write_dumps(tmp_path / "fr", mylab_dumps()))
    monkeypatch.chdir(tmp_path)  # no setup.cfg here: the environment alone configures
    monkeypatch.delenv("DDPWATCH_USER_PACKAGES", raising=False)
    sites = lambda incident: {r["rank"]: r["inflight"][0]["site"]["file"] for r in incident["ranks"]}
    assert sites(report_json(capsys, "--flight-recorder", folder)) == {0: USER, 1: USER}
    monkeypatch.setenv("DDPWATCH_USER_PACKAGES", "mylab")
    assert sites(report_json(capsys, "--flight-recorder", folder)) == {0: MYLAB_LOOP, 1: MYLAB_LOOP}
    (tmp_path / "setup.cfg").write_text("[ddpwatch]\nuser_packages = mylab\n")
    monkeypatch.delenv("DDPWATCH_USER_PACKAGES")
    assert sites(report_json(capsys, "--flight-recorder", folder)) == {0: MYLAB_LOOP, 1: MYLAB_LOOP}


def test_a_bad_package_setting_stops_the_flight_recorder_report_with_one_line(tmp_path, capsys, monkeypatch):
    folder = str(write_dumps(tmp_path / "fr", mylab_dumps()))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPWATCH_USER_PACKAGES", "my-lab")
    monkeypatch.setenv("DDPWATCH_DIR", str(tmp_path / "no" / "such"))  # a setting the report does not use: ignored
    assert cli.main(["report", "--flight-recorder", folder]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpwatch report: ") and "DDPWATCH_USER_PACKAGES" in err and err.count("\n") == 1
    monkeypatch.setenv("DDPWATCH_USER_PACKAGES", "mylab")
    assert cli.main(["report", "--flight-recorder", folder]) == 0


@pytest.mark.parametrize(
    "fr_op, record_op",
    [
        ("allreduce", "all_reduce"),
        ("all_reduce", "all_reduce"),
        ("_allgather_base", "all_gather"),
        ("allgather_base", "all_gather"),
    ],
)
def test_live_pairing_with_the_flight_recorder_names_ops_as_the_catalogue_does(fr_op, record_op):
    """watch/evidence.py had its own op-name key ('allgather_base' never met 'all_gather'); catalogue.canonical_op
    is the one now."""
    from ddpwatch.watch import evidence

    entry = {"collective_seq_id": 7, "process_group": ["0", ""], "profiling_name": f"gloo:{fr_op}", "is_p2p": False}
    record = {"group": "0", "op": record_op}
    state = {"flight_recorder": {"entries": [evidence._compact_fr_entry(entry)]}, "inflight": [record]}
    evidence.align_flight_recorder(state)
    assert record["flight_recorder"]["seq"] == 7


def _reduce_frames(line, function="log_metrics"):
    return [
        frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 3252),
        frame(function, USER, line),
        frame("<module>", USER, 99),
    ]


def test_collectives_that_completed_with_different_dtypes_are_found_in_the_dumps(tmp_path, capsys):
    """Issue 28: every op completed, so nothing hangs; the dumps still show rank 1 reduced int32 where rank 0
    reduced float32, and where."""
    common = [entry(1, "barrier", barrier_frames(80))]
    dumps = {
        0: dump(common + [entry(2, "all_reduce", _reduce_frames(20), sizes=[(4,)], dtypes=["Float"])]),
        1: dump(common + [entry(2, "all_reduce", _reduce_frames(20), sizes=[(4,)], dtypes=["Int"])]),
    }
    report = report_json(capsys, "--flight-recorder", str(write_dumps(tmp_path / "fr", dumps)))
    [finding] = report["findings"]
    assert report["trigger"] == "mismatch" and finding["kind"] == "silent_mismatch"
    assert finding["facts"]["differs"] == ["dtype"] and finding["location"]["line"] == 20


def test_the_same_lines_in_another_order_in_the_dumps_are_crossed_collectives(tmp_path, capsys):
    def ops(lines):
        return [
            entry(2 + i, "all_reduce", _reduce_frames(line), sizes=[(1,)], dtypes=["Float"])
            for i, line in enumerate(lines)
        ]

    dumps = {
        0: dump([entry(1, "barrier", barrier_frames(80))] + ops([30, 31])),
        1: dump([entry(1, "barrier", barrier_frames(80))] + ops([31, 30])),
    }
    [finding] = report_json(capsys, "--flight-recorder", str(write_dumps(tmp_path / "fr", dumps)))["findings"]
    assert finding["kind"] == "crossed_collectives" and finding["facts"]["seqs"] == [2, 3]


def test_matching_dumps_without_a_hang_give_no_finding(tmp_path, capsys):
    same = [
        entry(1, "barrier", barrier_frames(80)),
        entry(2, "all_reduce", _reduce_frames(20), sizes=[(4,)], dtypes=["Float"]),
    ]
    report = report_json(capsys, "--flight-recorder", str(write_dumps(tmp_path / "fr", {0: dump(same), 1: dump(same)})))
    assert report["findings"] == []
