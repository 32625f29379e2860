"""The session behind guard(): one per process, shared by nested guards; patches, and arms a watchdog per default group."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading

from . import config as config_module
from .patch import Patcher
from .record import Recorder

log = logging.getLogger("ddpwatch")


class Session:
    """Everything ddpwatch changed in this process, so that it can all be undone."""

    def __init__(self, config):
        self.config = config
        self.recorder = Recorder(config.ring_size)
        self.patcher = Patcher(self.recorder)
        self.watchdog = None
        self.users = 0
        self.pid = os.getpid()
        self._init_patch = []

    def start(self) -> None:
        self.patcher.patch()
        self._wrap_lifecycle()
        self.arm()

    def close(self) -> None:
        self.disarm()
        self._unwrap_lifecycle()
        self.patcher.unpatch()

    # ----- arming: a watchdog exists only while a default process group does -----
    def arm(self) -> None:
        if self.watchdog is not None or os.getpid() != self.pid:
            return  # already armed, or a forked child (DataLoader worker): never watch from there
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            from .store import StateStore
            from .watchdog import Watchdog

            world_size = dist.get_world_size()
            run_tag = config_module.job_id()
            store = StateStore.from_default_group(run_tag or "job", world_size)
            self.watchdog = Watchdog(self.recorder, self.config, dist.get_rank(), world_size, store, run_tag)
            self.watchdog.start()
        except Exception:
            log.warning("ddpwatch: could not start the watchdog; training continues unwatched", exc_info=True)
            self.watchdog = None

    def disarm(self) -> None:
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.stop()

    def _wrap_lifecycle(self) -> None:
        """Arm right after init_process_group; disarm right before destroy_process_group (the store goes with it)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if self._init_patch:
            return
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
            for name, wrapper, original in (("init_process_group", init_process_group, original_init),
                                            ("destroy_process_group", destroy_process_group, original_destroy)):
                if getattr(owner, name, None) is original:
                    wrapper.__wrapped__ = original
                    setattr(owner, name, wrapper)
                    self._init_patch.append((owner, name, original))

    def _unwrap_lifecycle(self) -> None:
        while self._init_patch:
            owner, name, original = self._init_patch.pop()
            setattr(owner, name, original)


_lock = threading.RLock()
_session: Session | None = None


def install(**options) -> Session:
    """Start guarding this process (idempotent: a second call shares the first's session and settings)."""
    global _session
    with _lock:
        if _session is None:
            settings = config_module.load(options)
            _session = Session(settings)
            _session.start()
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


@contextlib.contextmanager
def guard(timeout: float | None = None, report_dir: str | None = None, action: str | None = None, **options):
    """Watch the enclosed distributed training for hangs; torch.distributed may be initialised before or inside."""
    overrides = dict(options, timeout=timeout, dir=report_dir, action=action)
    session = install(**overrides)
    try:
        yield session
    finally:
        uninstall()
