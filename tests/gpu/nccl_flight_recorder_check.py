"""GPU check of NCCL's own Flight Recorder read through ddpwatch's one reader (run by hand on a CUDA machine).

    TORCH_FR_BUFFER_SIZE=2000 python tests/gpu/nccl_flight_recorder_check.py

NCCL records into a recorder of its own (FlightRecorderCUDA, read by _dump_nccl_trace), apart from the generic one
gloo writes to. ddpwatch's evidence (the report's Flight Recorder tail, the stand-in for a collective Python never
saw) reads both through watch/flight_support.read_dump and translates the entries with flight_entries.py. One rank,
NCCL, one GPU: after a float32 all_reduce and a bfloat16 broadcast, the dump must hold both, named and typed as the
python recorder names them, and the tail must show them. Exits 0 on success, 1 on failure, 77 when no GPU/NCCL is
present. Not collected by pytest (no test_ prefix): CI machines have no GPU. UNVERIFIED: no GPU was lent to the
session that wrote it (issue 44 point 3); the fast test of read_dump's merging is tests/test_flight_feed.py.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

from ddpwatch import flight_entries
from ddpwatch.format import build
from ddpwatch.launch import free_port
from ddpwatch.watch import evidence, flight_support


def main() -> int:
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        print("SKIP: no CUDA device or no NCCL")
        return 77
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # read by the process group when it is made
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        dist.all_reduce(torch.ones(1024, device="cuda"))
        dist.broadcast(torch.ones(8, dtype=torch.bfloat16, device="cuda"), 0)
        torch.cuda.synchronize()
        has_reader = hasattr(torch._C._distributed_c10d, "_dump_nccl_trace")
        dump = flight_support.read_dump()
        entries = (
            [] if dump is None else [e for e in dump["entries"] if str(e.get("profiling_name")).startswith("nccl")]
        )
        seen = [
            (
                flight_entries.canonical_op(e.get("profiling_name"))[0],
                flight_entries.shapes_and_dtypes(e, build.TENSORS_KEPT)[1],
            )
            for e in entries
        ]
        tail = evidence.flight_recorder_tail()
    finally:
        dist.destroy_process_group()
    print(
        f"_dump_nccl_trace present: {has_reader}; NCCL entries read: {seen}; "
        f"tail: {tail.get('unavailable') or len(tail['entries'])}"
    )
    ok = (
        has_reader and ("all_reduce", ["float32"]) in seen and ("broadcast", ["bfloat16"]) in seen and "entries" in tail
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
