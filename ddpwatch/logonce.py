"""The one log-once helper: a warning through the ddpwatch logger the first time its key is seen; no torch."""

from __future__ import annotations


def log_once(seen: set, key: str, message: str, *args, **kwargs) -> None:
    """Warn `message` unless `key` is in `seen` (the caller's set: one per process, or one per watchdog).

    logging is imported only when there is something to say: start-up under DDPWATCH=1 stays lean."""
    if key in seen:
        return
    seen.add(key)
    import logging

    logging.getLogger("ddpwatch").warning(message, *args, **kwargs)
