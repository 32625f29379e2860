"""A test backend ("fakenccl") with NCCL's host-side semantics on CPU tensors: calls return at once, ops finish later.

What it models (ProcessGroupNCCL as torch 2.13 drives it, seen from the Python thread):
- Every collective returns to Python at once, async_op or not; the op runs later, off the calling thread.
- All ops of a process run one after another in issue order, whatever their group, like kernels on one CUDA stream
  (2.13 runs synchronous NCCL ops on the current stream): an op on group B issued after one on group A starts only
  once A has finished, so two groups used in opposite orders deadlock as they do on GPUs.
- `Work.is_completed()` turns True only when the op has finished. `Work.wait()` does not block the Python thread
  (NCCL only makes the current stream wait), except for a barrier (ProcessGroupNCCL syncs the stream to the host
  for barriers) and when given a timeout. It raises if the op already failed.
- `synchronize()` blocks until every op issued so far has finished, like `torch.cuda.synchronize()`, or a host read
  such as `loss.item()`: the sync point where a hung rank's Python thread really blocks.
- The Flight Recorder gets an entry per op, recorded on the calling thread with the caller's stack and the group's
  c10d name, as ProcessGroupNCCL does (written by the inner gloo group, so `profiling_name` says `gloo:` and `state`
  stays `scheduled`; an op deferred behind another group's is recorded later, on the launcher thread).

What it does not model:
- No devices, streams, CUDA events, kernels or memory: CPU tensors are written by gloo threads whenever the op
  runs, and nothing stops the program from reading them before `synchronize()`; a test program must call it
  wherever a real NCCL program would read results on the host.
- Callers in C++ (DDP's `_broadcast_coalesced`, `_verify_params_across_processes`, the bucket rebuild, and the
  Reducer's gradient all-reduce, which waits on `Work.get_future()` at the end of backward) read the results right
  after `wait()` with no stream to order them, so for them `wait()` and the future block until the op is done.
  On GPUs only the rebuild and the parameter check block the host; buffer broadcasts and the gradient all-reduce
  do not, so here `loss.backward()` blocks where under NCCL it returns and the next sync point blocks instead.
  A Python ProcessGroup cannot tell a C++ caller apart except by the Python frame below the call: ops issued
  from anywhere but `torch.distributed.distributed_c10d` count as C++ callers, and so do c10d's object
  collectives (they read sizes on the host, a sync point on NCCL too).
- NCCL's async ops run on a per-group internal stream that can overlap other groups; here every op, async or not,
  is on the one stream. The `get_future()` of a Python-issued op completes when the op finishes (NCCL's completes at
  once and syncs streams).
- send/recv are passed to gloo as they come (gloo runs them outside its queue), not ordered with collectives.
- No watchdog, no async error handling, no abort on timeout: a failed op fails its Work and `synchronize()`.

What Python cannot do here (torch 2.13):
- Be a c10d Backend inside a plain ProcessGroup, as ProcessGroupNCCL is: pybind trampolines exist only for
  ProcessGroup and Work, not Backend. So this is a ProcessGroup subclass: `type(group) is not ProcessGroup`,
  `group._get_backend(device)` finds nothing, and patches of ProcessGroup's methods on the class, or of the
  dispatcher ops (`torch.ops.c10d.allreduce_`), do not see its ops; patches of distributed_c10d's functions do.
- Show `is_completed()` to C++: the trampoline's holder forwards only `wait()` and `get_future()`.
- Fail a Python-made `torch.futures.Future` in a way C++ sees (see `_Op.future`).

Use: `import nccl_like; nccl_like.register()` then `dist.init_process_group("fakenccl")`.
"""

from __future__ import annotations

import atexit
import collections
import datetime
import sys
import threading

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import ProcessGroupGloo

NAME = "fakenccl"
_C10D_FILE = "distributed_c10d.py"
_stalled: set = set()  # op names that never complete (a simulated transport fault)
_issued: collections.Counter = collections.Counter()  # op name -> how many this process issued


class _Op:
    """One op: `start()` hands it to gloo and returns gloo's Work handles; a completer thread sees them finish."""

    def __init__(self, group, name: str, start):
        self.group, self.name, self._start = group, name, start
        self.done = threading.Event()
        self.error = None
        self.works: list = []
        self._lock = threading.Lock()
        self._future = None  # made when asked for

    def launch(self) -> bool:
        """Hand the op to gloo (it returns at once); False when there is nothing for a completer to wait for."""
        if self.name in _stalled:
            return False  # issued, never finishes: what a stuck wire looks like from the host
        try:
            works = self._start()
        except Exception as exc:  # gloo refused the op (bad arguments): the Work reports it
            self.finish(exc)
            return False
        self.works = list(works) if isinstance(works, (list, tuple)) else [works]
        return True

    def wait_for_gloo(self) -> None:
        error = None
        for work in self.works:
            try:
                work.wait()
            except Exception as exc:
                error = error or exc
        self.finish(error)

    def finish(self, error) -> None:
        with self._lock:
            self.error = error
            self.done.set()
            future = self._future
        if future is not None:
            self._settle(future)

    def _settle(self, future) -> None:
        if self.error is not None:
            future.set_exception(self.error)
            return
        values: list = []
        for work in self.works:
            try:
                values.extend(work.result())
            except RuntimeError:  # some gloo works keep no result
                pass
        future.set_result(values)

    def future(self):
        """gloo's own future when the op is one gloo op already issued, else a Python one completed at the end.

        Errors reach C++ callers only through gloo's: a Python-made Future carries an error as a value that Python
        unwraps, and DDP's Reducer, waiting on it in C++, would take that value for gradients (and crash).
        """
        if len(self.works) == 1:
            try:
                return self.works[0].get_future()
            except RuntimeError:  # some gloo works (reduce_scatter) have no future
                pass
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                settle_now = self.done.is_set()
            else:
                settle_now = False
            future = self._future
        if settle_now:
            self._settle(future)
        return future

    def wait_done(self, timeout=None) -> None:
        if not self.done.wait(timeout):
            raise RuntimeError(f"fakenccl: {self.name} did not complete within {timeout} s")
        if self.error is not None:
            raise RuntimeError(f"fakenccl: {self.name} failed: {self.error}") from self.error


class _Completer:
    """A thread that waits, in launch order, for the ops handed to gloo and marks them done.

    A gloo thread must never need the GIL while the interpreter shuts down, or the process dies with "terminate
    called without an active exception". So this waits in gloo's Work.wait() (GIL released) instead of using
    callbacks on gloo's futures, and it keeps each group's last finished gloo Works alive until that group's next op
    has finished: gloo's worker thread has dropped its reference by then, so the last one, which frees the tensors
    (and needs the GIL for that), is a Python thread, not gloo's.
    """

    def __init__(self, name: str):
        self._name = name
        self._kept: dict = {}  # group key -> the gloo Works of its last finished op
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._thread = None
        self._stopping = False

    def add(self, op: _Op) -> None:
        with self._cond:
            self._queue.append(op)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                op = self._queue.popleft()
            op.wait_for_gloo()
            self._kept[id(op.group)] = op.works

    def stop(self, timeout: float = 2.0) -> None:
        """End the thread once it has nothing left to wait for (a hung op keeps it, daemon, until exit)."""
        with self._cond:
            thread, self._stopping = self._thread, True
            self._cond.notify()
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self._thread = None if thread is None or not thread.is_alive() else thread
            self._stopping = False


class _Stream:
    """Every op of this process in issue order, as on one CUDA stream: none starts before the earlier ones finished.

    An op is handed to gloo at once, on the calling thread (so the Flight Recorder sees the caller), when all
    unfinished earlier ops are on the same gloo group: that group's single worker thread then runs it after them.
    Otherwise it is deferred, and a launcher thread hands it to gloo once every earlier op has finished.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._unfinished: list = []
        self._deferred: collections.deque = collections.deque()
        self._side: list = []  # send/recv: outside the ordering, waited for by synchronize() all the same
        self._launcher = None
        self.completer = _Completer("fakenccl-stream")
        self.side_completer = _Completer("fakenccl-p2p")

    def submit(self, op: _Op) -> None:
        with self._lock:
            _issued[op.name] += 1
            self._unfinished = [o for o in self._unfinished if not o.done.is_set()]
            starts_now = not self._deferred and all(o.group is op.group for o in self._unfinished)
            self._unfinished.append(op)
            if starts_now:
                self._launch(op)  # under the lock: the launcher cannot slip an earlier op in behind it
                return
            self._deferred.append(op)
            if self._launcher is None:
                self._launcher = threading.Thread(target=self._launch_deferred, name="fakenccl-launcher", daemon=True)
                self._launcher.start()
            self._wake.notify()

    def _launch(self, op: _Op) -> None:
        if op.launch():
            self.completer.add(op)

    def _launch_deferred(self) -> None:
        while True:
            with self._lock:
                while not self._deferred:
                    self._wake.wait()
                op = self._deferred[0]
                earlier = self._unfinished[: self._unfinished.index(op)]
            for other in earlier:
                other.done.wait()
            with self._lock:
                self._deferred.popleft()
                self._launch(op)

    def submit_side(self, op: _Op) -> None:
        with self._lock:
            _issued[op.name] += 1
            self._side = [o for o in self._side if not o.done.is_set()] + [op]
            if op.launch():
                self.side_completer.add(op)

    def forget_finished(self) -> None:
        with self._lock:
            self._unfinished = [o for o in self._unfinished if not o.done.is_set()]
            self._side = [o for o in self._side if not o.done.is_set()]

    def stop_threads(self) -> None:
        self.completer.stop()
        self.side_completer.stop()

    def unfinished(self) -> list:
        with self._lock:
            return self._unfinished + self._side


_STREAM = _Stream()
atexit.register(_STREAM.stop_threads)  # no thread of ours may sit in gloo while the interpreter ends
_live_groups: set = set()


def synchronize(timeout: float | None = None) -> None:
    """Block until every op issued so far in this process has finished (torch.cuda.synchronize); raise if one failed."""
    for op in _STREAM.unfinished():
        op.wait_done(timeout)


def issued() -> dict:
    """How many ops of each kind this process has issued through fakenccl (DDP's C++ ones included)."""
    return dict(_issued)


class Event:
    """CPU stand-in for torch.cuda.Event: `record()` marks the ops issued so far; `query()`: have they all finished?"""

    def __init__(self):
        self._ops: list = []

    def record(self) -> None:
        self._ops = _STREAM.unfinished()

    def query(self) -> bool:
        return all(op.done.is_set() for op in self._ops)

    def synchronize(self) -> None:
        for op in self._ops:
            op.wait_done()


def simulate_stall(op_name: str = "allreduce") -> None:
    """From now on every `op_name` op is issued but never finishes, and every later op queues behind it."""
    _stalled.add(op_name)


class Work(dist._Work):
    """NCCL-like handle: completion is the op's, `wait()` returns at once unless the caller needs the host blocked."""

    def __init__(self, op: _Op, blocks_host: bool):
        super().__init__()
        self._op = op
        self._blocks_host = blocks_host

    def is_completed(self) -> bool:
        return self._op.done.is_set()

    def is_success(self) -> bool:
        return self._op.done.is_set() and self._op.error is None

    def exception(self):
        return self._op.error

    def wait(self, timeout=None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if self._blocks_host or seconds:
            self._op.wait_done(seconds or None)
        elif self._op.error is not None:
            raise RuntimeError(f"fakenccl: {self._op.name} failed: {self._op.error}") from self._op.error
        return True

    def get_future(self):
        return self._op.future()


# c10d's object collectives read sizes and payloads on the host between their collectives: a sync point on NCCL.
_HOST_READERS = frozenset(
    (
        "all_gather_object",
        "broadcast_object_list",
        "gather_object",
        "scatter_object_list",
        "send_object_list",
        "recv_object_list",
    )
)


def _blocks_host(frame) -> bool:
    """Whether the issuer reads the result on the host right after wait(), so that wait() must block here.

    torch.distributed's Python collectives do not (the user syncs later), except inside object collectives;
    C++ callers (DDP) do, and come in from any frame other than distributed_c10d's.
    """
    if frame is None or not frame.f_code.co_filename.endswith(_C10D_FILE):
        return True
    for _ in range(12):  # the object collective is a few frames out (logging, deprecation and ddpwatch wrappers)
        frame = frame.f_back
        if frame is None:
            return False
        if frame.f_code.co_name in _HOST_READERS and frame.f_code.co_filename.endswith(_C10D_FILE):
            return True
    return False


class FakeNcclGroup(dist.ProcessGroup):
    """A Python ProcessGroup whose ops go through the process's one stream to an inner gloo group."""

    def __init__(
        self, store, rank: int, size: int, timeout: datetime.timedelta, group_name: str = "", global_ranks=None
    ):
        super().__init__(rank, size)
        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_default_device()]
        options._threads = 1  # one worker thread: gloo runs this group's ops in issue order
        options._timeout = timeout
        options.group_name = group_name  # Flight Recorder entries carry the c10d group name, as NCCL's do
        if global_ranks:
            options.global_ranks_in_group = list(global_ranks)
        self._inner = ProcessGroupGloo(dist.PrefixStore(f"{NAME}/", store), rank, size, options)
        self._group_name = group_name
        self._group_desc = ""
        _live_groups.add(id(self))

    def getBackendName(self) -> str:
        return NAME

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def shutdown(self) -> None:
        """destroy_process_group() calls this: end gloo's threads now, not during interpreter teardown."""
        self._inner.shutdown()
        self._closed()

    def abort(self) -> None:
        self._inner.abort()
        self._closed()

    def _closed(self) -> None:
        _STREAM.forget_finished()
        _live_groups.discard(id(self))
        if not _live_groups:
            _STREAM.stop_threads()

    def _issue(self, name: str, start, blocks_host: bool = False) -> Work:
        caller = sys._getframe(2)
        op = _Op(self._inner, name, start)
        _STREAM.submit(op)
        return Work(op, blocks_host or _blocks_host(caller))

    # ----- collectives: the names c10d's Python functions and the C++ trampoline call -----
    def broadcast(self, tensors, opts):
        return self._issue("broadcast", lambda: self._inner.broadcast(tensors, opts))

    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._issue("allreduce", lambda: self._inner.allreduce(tensors, opts))

    def allreduce_coalesced(self, tensors, opts):
        return self._issue("allreduce", lambda: self._inner.allreduce_coalesced(tensors, opts))

    def reduce(self, tensors, opts):
        return self._issue("reduce", lambda: self._inner.reduce(tensors, opts))

    def allgather(self, output_lists, inputs, opts):
        return self._issue("allgather", lambda: self._inner.allgather(output_lists, inputs, opts))

    def allgather_coalesced(self, output_lists, inputs, opts):
        return self._issue("allgather", lambda: self._inner.allgather_coalesced(output_lists, inputs, opts))

    def all_gather_single(self, output, input, opts):
        return self._issue("allgather", lambda: self._inner._allgather_base(output, input, opts))

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        return self._issue(
            "allgather", lambda: [self._inner._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        )

    def gather(self, output_lists, inputs, opts):
        return self._issue("gather", lambda: self._inner.gather(output_lists, inputs, opts))

    def scatter(self, outputs, input_lists, opts):
        return self._issue("scatter", lambda: self._inner.scatter(outputs, input_lists, opts))

    def reduce_scatter(self, outputs, input_lists, opts):
        return self._issue("reduce_scatter", lambda: self._inner.reduce_scatter(outputs, input_lists, opts))

    def reduce_scatter_single(self, output, input, opts):
        return self._issue("reduce_scatter", lambda: self._inner._reduce_scatter_base(output, input, opts))

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        return self._issue(
            "reduce_scatter", lambda: [self._inner._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        )

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        return self._issue(
            "alltoall", lambda: self._inner.alltoall_base(output, input, output_splits, input_splits, opts)
        )

    def alltoall(self, outputs, inputs, opts):
        return self._issue("alltoall", lambda: self._inner.alltoall(outputs, inputs, opts))

    # The names torch before 2.8 or so calls (its c10d and DDP's C++ through the trampoline).
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._issue("barrier", lambda: self._inner.barrier(opts), blocks_host=True)

    # ----- point to point: straight to gloo, tracked for completion and synchronize() only -----
    def send(self, tensors, dst: int, tag: int = 0):
        return self._issue_p2p("send", lambda: self._inner.send(tensors, dst, tag))

    def recv(self, tensors, src: int, tag: int = 0):
        return self._issue_p2p("recv", lambda: self._inner.recv(tensors, src, tag))

    def _issue_p2p(self, name: str, start) -> Work:
        caller = sys._getframe(2)
        op = _Op(None, name, start)
        _STREAM.submit_side(op)
        return Work(op, _blocks_host(caller))


def _create(backend_options, _pg_options=None) -> FakeNcclGroup:
    return FakeNcclGroup(
        backend_options.store,
        backend_options.group_rank,
        backend_options.group_size,
        backend_options.timeout,
        backend_options.group_id,
        backend_options.global_ranks_in_group,
    )


def register() -> None:
    """Make `dist.init_process_group("fakenccl")` and `new_group(backend="fakenccl")` available; idempotent."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
