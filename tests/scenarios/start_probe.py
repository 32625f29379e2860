"""What a rank sees of how it was started (tests/test_zygote.py): `python start_probe.py EXIT_CODE [raise|signal]`."""

import atexit
import json
import os
import signal
import sys
import threading
import time


def facts() -> dict:
    return {
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "name": __name__,
        "file": __file__,
        "rank": os.environ.get("RANK"),
        "probe": os.environ.get("PROBE"),
        "stdin": sys.stdin.read(),
        "own_group": os.getpgid(0) != os.getpgid(os.getppid()),
        "main_is_this_script": getattr(sys.modules["__main__"], "facts", None) is facts,
    }


def main() -> None:
    print("FACTS " + json.dumps(facts()), flush=True)
    atexit.register(lambda: print("ATEXIT", flush=True))
    # a non-daemon thread: the interpreter's exit waits for it, then runs atexit
    threading.Thread(target=lambda: (time.sleep(0.2), print("THREAD-DONE", flush=True))).start()
    how = sys.argv[2] if len(sys.argv) > 2 else "exit"
    if how == "raise":
        raise RuntimeError("probe raised")
    if how == "signal" and os.environ.get("RANK") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdout.write("BUFFERED-NO-NEWLINE")  # left in the buffer: the interpreter's exit flushes it
    sys.exit(int(sys.argv[1]))


if __name__ == "__main__":
    main()
