"""The seed stall without ddpwatch and with a short process-group timeout: what torch alone ends with, and when.

--tool picks the native tool that stands in for ddpwatch (benchmarks/native_tools.py runs each): `timeout` (torch's
process-group timeout alone; TORCH_DISTRIBUTED_DEBUG is set by the caller), `monitored_barrier` (the epoch's last
barrier is `dist.monitored_barrier`, which names the ranks that did not arrive), `flight_dump` (each rank dumps
torch's Flight Recorder with `_dump_fr_trace()` into --dump-dir once its rank has been stuck for DUMP_AFTER_S, as a
user's own watchdog thread would: torch dumps nothing on a gloo timeout).
"""

import argparse
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

# The same model and data as the demo's script; importing it imports ddpwatch but patches nothing.
from ddpwatch.examples.seed_stall import loader, small_cnn


DUMP_AFTER_S = 3.0
STUCK = {"since": None}  # when this rank began the step where the seed stall hangs


def train(model, epochs, tool="timeout", timeout_s=20.0):
    """ddpwatch/examples/seed_stall.py's loop: rank-0-only validation through the DDP wrapper."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for inputs, labels in loader(32, seed=dist.get_rank()):
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            dist.barrier()
        STUCK["since"] = time.monotonic()
        if dist.get_rank() == 0:
            print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)
            with torch.no_grad():
                for inputs, _ in loader(24, seed=100):
                    model(inputs)  # the seed's bug: the DDP wrapper, on rank 0 only
        if tool == "monitored_barrier":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
        else:
            dist.barrier()
        STUCK["since"] = None


def dump_flight_recorder_when_stuck(folder):
    """A daemon thread: once this rank has sat DUMP_AFTER_S in the step that hangs, write its Flight Recorder dump
    (pickle, with stacks) to folder/fr_trace_<rank>, the name torch's own dumps carry."""
    import torch._C._distributed_c10d as c10d_c

    def watch():
        while True:
            since = STUCK["since"]
            if since is not None and time.monotonic() - since >= DUMP_AFTER_S:
                path = os.path.join(folder, f"fr_trace_{dist.get_rank()}")
                with open(path + ".tmp", "wb") as handle:
                    handle.write(c10d_c._dump_fr_trace())
                os.replace(path + ".tmp", path)
                print(f"BENCH-MARK dumped {time.time():.3f} {path}", file=sys.stderr, flush=True)
                return
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=20.0, help="process-group timeout in seconds")
    parser.add_argument("--tool", choices=("timeout", "monitored_barrier", "flight_dump"), default="timeout")
    parser.add_argument("--dump-dir", help="flight_dump: where each rank writes its dump")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    if args.tool == "flight_dump":
        dump_flight_recorder_when_stuck(args.dump_dir)
    try:
        train(DistributedDataParallel(small_cnn()), epochs=2, tool=args.tool, timeout_s=args.timeout)
    except Exception as exc:
        # The moment and the words torch ends with: what a user would have to go on without ddpwatch.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"BENCH-MARK error {time.time():.3f} {type(exc).__name__}: {first}", file=sys.stderr, flush=True)
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
