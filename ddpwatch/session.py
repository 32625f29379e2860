"""The session behind guard(): one per process, shared by nested guards; patches, arms a watchdog per default group."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import sys
import threading

from . import config as config_module
from .logonce import log_once
from .watch import crashes, signals
from .watch.store import StoreUnavailable
from .capture import failures, loaders, reduce_ops
from .capture.replacements import Patches
from .capture.wrappers import Patcher
from .capture.record import FLIGHT, Recorder
from .capture.sites import configure_frames

log = logging.getLogger("ddpwatch")
_SAID: set = set()  # what this process said once, whatever the sessions it arms


class Session:
    """Everything ddpwatch changed in this process, so that it can all be undone."""

    def __init__(self, config):
        self.config = config
        self.recorder = Recorder(config.ring_size)
        self.patcher = Patcher(self.recorder)
        self.watchdog = None
        self.control = None  # SIGUSR1/SIGTERM handlers and the `ddpwatch dump` registry entry, while armed
        self.users = 0
        self.held = False  # zero-code activation holds one install() until the process exits
        self.pid = os.getpid()
        self.faults = None  # crashes.FaultFile: where faulthandler writes this rank's stacks if the backend aborts it

    def start(self) -> None:
        configure_frames(self.config.user_packages, self.config.library_packages)
        self.patcher.patch(per_op=self.config.recorder != FLIGHT)  # auto: python, until flight covers every finding
        loaders.install(self.patcher.patches, lambda: self.recorder.ddp_steps)  # DataLoader epochs (once per epoch)
        self._wrap_lifecycle()
        self.arm()

    def close(self) -> None:
        """Undo everything start() did, also after a start() that failed half-way."""
        try:
            self.disarm()
        finally:
            self.patcher.unpatch()

    # ----- arming: a watchdog exists only while a default process group does -----
    def arm(self) -> None:
        if self.watchdog is not None or os.getpid() != self.pid:
            return  # already armed, or a forked child (DataLoader worker): never watch from there
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            from .watch.store import StateStore
            from .watch.watchdog import Watchdog

            world_size = dist.get_world_size()
            run_tag = config_module.run_tag()  # the job, and torchrun's attempt: a restart is a new run
            store = StateStore.from_default_group(run_tag or "job", world_size)
            feed = self._flight_feed()
            self.watchdog = Watchdog(self.recorder, self.config, dist.get_rank(), world_size, store, run_tag, feed)
            self.watchdog.start()
            self.faults = crashes.FaultFile.arm(store.job_token, self.watchdog.rank)
        except StoreUnavailable as exc:  # a store ddpwatch cannot publish in (FakeStore): one line, once
            log_once(_SAID, "store", "ddpwatch: no watchdog: %s; training continues unwatched", exc)
            self.watchdog = None
            return
        except Exception:
            log.warning("ddpwatch: could not start the watchdog; training continues unwatched", exc_info=True)
            self.watchdog = None
            return
        self._start_control(self.watchdog.mailbox, self.watchdog.rank, world_size, config_module.job_id())

    def _flight_feed(self):
        """The Flight Recorder's feed where this session records with it; else None, the per-op wrappers in place
        (asked for, but unavailable: said once, and the python recorder records instead)."""
        if self.patcher.per_op:
            return None
        from .watch import flight, flight_support

        why = flight_support.why_not_here()
        if why is not None:
            log.warning("ddpwatch: recorder=flight, but %s; recording with the python recorder instead", why)
            self.patcher.add_per_op()
            return None
        self.recorder.note_recorded_by(FLIGHT)
        self.patcher.hook_work_wait()  # a failed wait is how a rank learns at once that a peer is gone
        failures.install(self.patcher)  # and so is a synchronous collective that raises
        notes = reduce_ops.ReduceNotes()
        reduce_ops.install(self.patcher.patches, notes)  # the Flight Recorder does not keep the reduce op
        return flight.FlightFeed(self.recorder, self.patcher.group_name, notes)

    def _start_control(self, mailbox, rank: int, world_size: int, job: str) -> None:
        """SIGUSR1 -> a report now; SIGTERM -> a report being written may finish; an entry for `ddpwatch dump`."""
        if not self.config.signals:
            return
        try:
            control = signals.LiveControl(mailbox)
            entry = {
                "pid": self.pid,
                "rank": rank,
                "world_size": world_size,
                "job": job,
                "master": config_module.rendezvous_address(),
                "dir": os.path.abspath(self.config.dir),
                "program": _program_name(),
            }
            if control.start(entry):
                self.control = control
        except Exception:
            log.warning("ddpwatch: could not install the SIGUSR1/SIGTERM handlers; no on-demand dumps", exc_info=True)

    def disarm(self) -> None:
        watchdog = self.watchdog
        if watchdog is not None and watchdog.mailbox.report_in_progress():
            watchdog.stop()  # first, while ddpwatch's SIGTERM handler, which waits for that report, is installed
        control, self.control = self.control, None
        if control is not None:
            try:
                control.stop()
            except Exception:
                log.warning("ddpwatch: could not restore the signal handlers", exc_info=True)
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.stop()
        faults, self.faults = self.faults, None
        if faults is not None:
            faults.disarm()

    def request_dump(self) -> None:
        """A report now, from every rank, without stopping the job; safe from a signal handler or another thread."""
        watchdog = self.watchdog
        if watchdog is not None:
            watchdog.request_dump()

    def forked(self) -> None:
        """In a forked child (a DataLoader worker): no rank, so it neither watches, publishes nor answers signals."""
        control, self.control = self.control, None
        if control is not None:
            control.reset_in_child()
        if self.watchdog is not None:
            self.watchdog = None  # its thread stayed in the parent; stop() here would publish "exited" for the rank
        else:
            self.pid = os.getpid()  # the parent was not a rank: this child may become one (fork start method)

    def _wrap_lifecycle(self) -> None:
        """Arm right after init_process_group; disarm right before destroy_process_group (the store goes with it).

        Installed through the Patcher like every other patch: one marker, one undo list, restored by unpatch().
        """
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        session = self
        original_init, original_destroy = c10d.init_process_group, c10d.destroy_process_group

        def init_process_group(*args, **kwargs):
            result = original_init(*args, **kwargs)
            session.arm()
            return result

        def destroy_process_group(group=None, *args, **kwargs):
            if group is None or group is getattr(c10d.GroupMember, "WORLD", None):
                session.disarm()
            return original_destroy(group, *args, **kwargs)

        for owner in (dist, c10d):
            for name, wrapper, original in (
                ("init_process_group", init_process_group, original_init),
                ("destroy_process_group", destroy_process_group, original_destroy),
            ):
                if getattr(owner, name, None) is original:
                    wrapper.__wrapped__ = original  # type: ignore[attr-defined]  # a function takes any attribute
                    self.patcher.patches.replace(owner, name, wrapper)


_lock = threading.RLock()
_session: Session | None = None


def _program_name() -> str:
    """The script's file name for `ddpwatch dump --list`; never its arguments, which may hold secrets (--token)."""
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return os.path.basename(script) or os.path.basename(sys.executable)


def install(**options) -> Session:
    """Start guarding this process (idempotent: a second call shares the first's session and settings)."""
    global _session
    with _lock:
        if _session is None:
            session = Session(config_module.load(options))
            try:
                session.start()
            except BaseException:
                session.close()  # transactional: a failed start leaves nothing patched and no session behind
                raise
            _session = session
            atexit.register(_shutdown_at_exit)
        _session.users += 1
        return _session


def uninstall() -> None:
    """Undo one install(); the last one stops the watchdog and restores every patch."""
    global _session
    with _lock:
        if _session is None:
            return
        _session.users -= 1
        if _session.users <= 0:
            session, _session = _session, None
            session.close()


def _shutdown_at_exit() -> None:
    """A watchdog thread alive at interpreter shutdown can crash the process: stop and join it first."""
    global _session
    with _lock:
        if _session is not None:
            session, _session = _session, None
            try:
                session.close()
            except Exception:
                pass


def current() -> Session | None:
    return _session


def _after_fork_in_child() -> None:
    if _session is not None:
        _session.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ----- zero-code activation (DDPWATCH=1; see ddpwatch/bootstrap): the first init_process_group installs -----

_activation = Patches()  # init_process_group where activate_on_init() hooked it; outlives every session


def activate_on_init() -> bool:
    """Hook init_process_group so that its first call installs the guard, held until exit, and arms it.

    Called once torch.distributed has been imported; installs nothing by itself, so a process that never
    initialises a process group (torchrun's agent, a DataLoader worker, any other program) is left as it was.
    """
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    original = getattr(c10d, "init_process_group", None)
    if original is None or getattr(original, "__ddpwatch_activation__", False):
        return False
    hook = _activating(original)
    with _lock:
        for name in ("torch.distributed", "torch.distributed.distributed_c10d", "torch.distributed.device_mesh"):
            module = sys.modules.get(name)
            if module is not None and getattr(module, "init_process_group", None) is original:
                _activation.replace(module, "init_process_group", hook)
    return True


def deactivate_on_init() -> None:
    """Undo activate_on_init() (tests; a process under DDPWATCH=1 keeps the hook until it exits)."""
    with _lock:
        _activation.undo(only_where_ours=True)


def _activating(original):
    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        session = _hold()
        result = original(*args, **kwargs)
        if session is not None:
            session.arm()
        return result

    init_process_group.__ddpwatch_activation__ = True  # type: ignore[attr-defined]  # one hook per process (see above)
    return init_process_group


def _hold() -> Session | None:
    """The zero-code install: shared with any guard() of the program, released only at exit."""
    try:
        with _lock:
            if _session is None or not _session.held:
                install().held = True
            return _session
    except config_module.ConfigError as exc:  # an error before training starts, as with guard(): never unwatched
        raise config_module.ConfigError(
            f"{exc} (DDPWATCH is set, so init_process_group starts ddpwatch's guard "
            f"here; fix the setting, or unset DDPWATCH to run unwatched)"
        ) from None
    except Exception:
        log.warning("ddpwatch: could not install the guard; training continues unwatched", exc_info=True)
        return None


def _old_report_dir(dir: str | None, report_dir: str | None) -> str | None:  # noqa: A002
    import warnings

    if dir is not None:
        raise TypeError("guard() takes dir= (report_dir= is its old name): give one of them")
    warnings.warn("guard(report_dir=...) is now guard(dir=...), like the option", DeprecationWarning, stacklevel=4)
    return report_dir


@contextlib.contextmanager
def guard(timeout: float | None = None, dir: str | None = None, action: str | None = None, **options):  # noqa: A002
    """Watch the enclosed distributed training for hangs; torch.distributed may be initialised before or inside.

    `dir` is the option of that name, as everywhere else; the old spelling `report_dir=` still works, with a
    DeprecationWarning."""
    if "report_dir" in options:
        dir = _old_report_dir(dir, options.pop("report_dir"))
    overrides = dict(options, timeout=timeout, dir=dir, action=action)
    session = install(**overrides)
    try:
        yield session
    finally:
        uninstall()
