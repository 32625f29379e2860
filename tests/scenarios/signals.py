"""A program's own SIGTERM / SIGINT handling on 2 gloo ranks: `python signals.py CASE`; no ddpwatch import anywhere.

Run once under DDPWATCH=1 and once without, the same case must end the same way (exit code, files, log lines).
Each rank writes READY_DIR/<rank>.ready (its pid) once it is stepping; the test then signals both ranks.
Cases:
- term_after: after init_process_group (so after ddpwatch armed) a SIGTERM handler that saves a checkpoint
  (CKPT_DIR/rank<r>.pt, slowly, as a real one does) and calls sys.exit(0); then all_reduce steps.
- term_before: the same handler, installed before init_process_group (ddpwatch chains to it).
- interrupt: no handler; SIGINT's KeyboardInterrupt is caught around the loop: checkpoint, exit 130.
- blocked: no handler; rank 0 waits in a barrier rank 1 never reaches (SIGTERM must end both by the signal).
- term_one: term_after's handler, but only rank 1 is signalled: rank 0's all_reduce fails when rank 1 leaves, and
  its `except` says how long after rank 1 left that came, and exits 4.
- peer_dies: no signal; once stepping, rank 1's connections close (as at its death) while rank 0 waits in
  all_reduce inside `try: ... except RuntimeError:`, which writes an emergency checkpoint (saying how long after the peer left),
  waits LINGER_S (default 0) and re-raises; rank 1 leaves with os._exit(5) once that checkpoint is on disk.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

LIMIT_S = 60.0  # a rank never signalled gives up: exit 3, never a hang
PEER_LIVES_S = 10.0  # peer_dies: the longest the peer's process outlives its connections
SAVING_S = 0.3  # a checkpoint takes a while to write: the window in which a second SIGTERM action would cut it


def rank():
    return int(os.environ["RANK"])


def say(text):
    # One write, line and newline together: print() writes them apart, and a signal handler that says something
    # in between ran two lines into one ("readySIGNALS rank 0 sigint: saving", seen once under the suite's load).
    sys.stderr.write(f"SIGNALS rank {rank()} {text}\n")
    sys.stderr.flush()


def save_checkpoint(how):
    say(f"{how}: saving")
    path = os.path.join(os.environ["CKPT_DIR"], f"rank{rank()}.pt")
    torch.save({"rank": rank(), "how": how}, path + ".tmp")
    time.sleep(SAVING_S)
    os.replace(path + ".tmp", path)
    say(f"{how}: saved")


def on_sigterm(signum, frame):
    save_checkpoint("sigterm")
    leaving()
    sys.exit(0)


def leaving():
    """Note when this rank leaves, for the peer's `except` to say how soon it heard."""
    path = os.path.join(os.environ["CKPT_DIR"], f"left{rank()}")
    with open(path + ".tmp", "w") as handle:
        handle.write(repr(time.time()))
    os.replace(path + ".tmp", path)


def heard(peer):
    """'after S s': how long after `peer` left this rank's collective failed (the tests compare it with the plain
    arm's, measured in the same test: a busy machine slows both)."""
    with open(os.path.join(os.environ["CKPT_DIR"], f"left{peer}")) as handle:
        return f"after {time.time() - float(handle.read()):.3f} s"


def ready():
    path = os.path.join(os.environ["READY_DIR"], f"{rank()}.ready")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    say("ready")


def steps():
    """all_reduce steps until a signal ends the rank; a peer that left first (its own signal) is waited out."""
    deadline = time.monotonic() + LIMIT_S
    step = 0
    while time.monotonic() < deadline:
        try:
            dist.all_reduce(torch.ones(4))
        except RuntimeError:
            if sys.argv[1] == "term_one":  # only the peer was signalled
                say(f"peer gone, heard {heard(1)}")
                # Left to interpreter exit, torch's teardown of the broken gloo group aborted the process ("terminate
                # called without an active exception", exit -6) in 2 of 3 plain runs: the program tears it down.
                dist.destroy_process_group()
                sys.exit(4)
            # The peer ended by its own signal while this rank waited in the collective; this rank's signal
            # was sent at the same moment, and its handler runs as soon as Python does.
            time.sleep(10.0)
            say("peer gone, no signal here")
            sys.exit(4)
        step += 1
        if step == 20:
            ready()
        time.sleep(0.02)
    say("never signalled")
    sys.exit(3)


def blocked():
    dist.all_reduce(torch.ones(4))
    ready()
    if rank() == 0:
        dist.barrier()  # rank 1 never comes: the main thread waits inside gloo
    else:
        time.sleep(LIMIT_S)
    say("never signalled")
    sys.exit(3)


def close_connections_to_peers():
    """Shut this rank's gloo connections the way its death would (the peer's collective fails with "Connection
    closed by peer"), the process living on: every TCP connection but the one to the job's store."""
    import socket

    import psutil

    store_port = int(os.environ["MASTER_PORT"])
    for connection in psutil.Process().net_connections(kind="tcp"):
        if connection.raddr and connection.raddr.port != store_port and connection.fd >= 0:
            with socket.socket(fileno=os.dup(connection.fd)) as peer:
                peer.shutdown(socket.SHUT_RDWR)


def wait_for_file(path, limit_s):
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def peer_dies():
    for step in range(20):
        dist.all_reduce(torch.ones(4))
        time.sleep(0.02)
    if rank() == 1:
        time.sleep(1.0)  # rank 0 waits in its all_reduce meanwhile
        leaving()
        # Its connections close first, its process goes once rank 0's except has saved (at most PEER_LIVES_S): a
        # launcher's SIGTERM, sent when this process exits, can then cut no checkpoint that plain torch would
        # have written. (Exiting at once raced torchrun's 0.1 s poll against gloo's failure: plain torch lost
        # the checkpoint in 1 run of 6.)
        close_connections_to_peers()
        wait_for_file(os.path.join(os.environ["CKPT_DIR"], "rank0.pt"), PEER_LIVES_S)
        os._exit(5)
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError:
        path = os.path.join(os.environ["CKPT_DIR"], f"rank{rank()}.pt")
        torch.save({"rank": rank(), "how": "emergency"}, path + ".tmp")
        os.replace(path + ".tmp", path)
        say(f"emergency checkpoint saved, heard {heard(1)}")
        time.sleep(float(os.environ.get("LINGER_S", "0")))
        raise
    say("the peer never left")
    sys.exit(3)


def main():
    case = sys.argv[1]
    torch.set_num_threads(1)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started from a shell's background job: give SIGINT the handler an interactive start would have
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if case == "term_before":
        signal.signal(signal.SIGTERM, on_sigterm)
    dist.init_process_group("gloo")
    session = sys.modules.get("ddpwatch.session")
    say(f"ddpwatch armed={int(bool(session and session.current() is not None))}")
    if case in ("term_after", "term_one"):
        signal.signal(signal.SIGTERM, on_sigterm)
    if case == "peer_dies":
        peer_dies()
    if case == "blocked":
        blocked()
    try:
        steps()
    except KeyboardInterrupt:
        save_checkpoint("sigint")
        sys.exit(130)


if __name__ == "__main__":
    main()
