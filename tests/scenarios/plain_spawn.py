"""torch.multiprocessing.spawn ranks reading a DataLoader with 2 workers; no ddpwatch import anywhere.

`plain_spawn.py PORT FOLDER`: each rank (a spawned interpreter) writes FOLDER/rank-<r>.json saying whether
ddpwatch armed it (under DDPWATCH=1 it must) and whether any DataLoader worker ran a ddpwatch thread or an armed
session (none may), once every worker has answered; it also prints the same as one PLAIN-SPAWN line. Exits 0.

A file per rank, not stdout: both ranks leave their last all_reduce together and print at once into one shared
output, and print() writes the text and its newline separately, so on a loaded machine one rank's line landed
inside the other's (`...workers=2PLAIN-SPAWN rank 1 ...`) and a test that parsed the output failed.
"""

import json
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset


def ddpwatch_state():
    """(armed, ddpwatch threads) of this process, looked up without importing ddpwatch.

    Armed: a watchdog or signal handling of ddpwatch's, a SIGUSR1 handler, or a signal wakeup fd in place.
    """
    session_module = sys.modules.get("ddpwatch.session")
    session = session_module.current() if session_module else None
    armed = session is not None and (session.watchdog is not None or session.control is not None)
    wakeup_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd)
    armed = armed or wakeup_fd != -1 or signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL
    threads = sum(t.name.startswith("ddpwatch") for t in threading.enumerate())
    return armed, threads


class Probe(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        armed, threads = ddpwatch_state()
        return torch.tensor([float(index)]), torch.tensor([float(armed), float(threads), float(os.getpid())],
                                                          dtype=torch.float64)


def rank_main(rank, world_size, port, folder):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    armed, threads = ddpwatch_state()
    probes = []
    # Forked workers inherit the rank's whole state (ddpwatch's too): the case to check. (Left to itself, a
    # DataLoader in a spawned rank spawns its workers: fresh interpreters that never arm.)
    for x, probe in DataLoader(Probe(), batch_size=4, num_workers=2, multiprocessing_context="fork"):
        dist.all_reduce(x)  # a collective per batch, as training would issue
        probes.append(probe)
    probes = torch.cat(probes)  # every batch is in: each worker has run and answered, none is still starting
    worker_pids = {int(pid) for pid in probes[:, 2].tolist()}
    result = {"rank": rank, "armed": int(armed), "threads": threads, "worker_armed": int(probes[:, 0].sum()),
              "worker_threads": int(probes[:, 1].sum()), "workers": len(worker_pids - {os.getpid()})}
    path = os.path.join(folder, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(path + ".tmp", path)  # the test sees a whole file or none
    sys.stdout.write("PLAIN-SPAWN " + " ".join(f"{k}={v}" for k, v in result.items()) + "\n")  # one write
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(2, int(sys.argv[1]), sys.argv[2]), nprocs=2)
