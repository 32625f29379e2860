"""GPU check of the NCCL path (run by hand on a CUDA machine): "in flight" means "not completed", not "in the call".

    python tests/gpu/nccl_inflight_check.py

One rank, NCCL, one GPU. A large all_reduce queued behind a long matmul returns to Python before the GPU has
finished it; ddpwatch must keep the record in flight (Work.is_completed() is False) until the GPU catches up, and
then complete it through the watchdog's poll. Exits 0 on success, 1 on failure, 77 when no GPU/NCCL is present.
It is not collected by pytest (no test_ prefix): CI machines have no GPU.
"""

import datetime
import sys
import time

import torch
import torch.distributed as dist

import ddpwatch
from ddpwatch.launch import free_port


def main() -> int:
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        print("SKIP: no CUDA device or no NCCL")
        return 77
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=60))
    with ddpwatch.guard(interval=0.1) as session:
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda:0"))
        a = torch.randn(8192, 8192, device="cuda")
        for _ in range(20):
            a = a @ a / 8192  # keep the stream busy for a while
        dist.all_reduce(torch.ones(64 * 2**20, device="cuda"))
        inflight_right_after = len(session.recorder.inflight)
        torch.cuda.synchronize()
        deadline = time.monotonic() + 5
        while session.recorder.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        inflight_after_sync = len(session.recorder.inflight)
        dist.destroy_process_group()
    print(f"in flight right after the call: {inflight_right_after}; after synchronize + poll: {inflight_after_sync}")
    ok = inflight_right_after == 1 and inflight_after_sync == 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
