"""The attribution levels of benchmarks/whole_job.py: ddpwatch under DDPWATCH=1 with the parts above a level off.

ddpwatch has no option that switches one of its parts off (docs/configuration.md: the options tune the watchdog,
none removes it), and adding user options only for a benchmark would put untested modes into the product. So, like
benchmarks/attribution.py, a rank of the benchmark's job monkeypatches ddpwatch's internals before its process
group starts (whole_job_train.py calls switch_off_above() when BENCH_WHOLEJOB_LEVEL is set): the code that runs is
ddpwatch's own, minus the parts above the level. Each level adds one part to the one below:

0 plain             DDPWATCH unset: nothing of ddpwatch is imported (the .pth line reads one variable).
1 start-up          DDPWATCH=1: the start-up hook in every Python process (torchrun's agent too), the
                    configuration, ddpwatch's modules imported (the watchdog's and the store's too), the session
                    made at init_process_group, its exit handler; nothing patched, no watchdog.
2 wrappers          + the collective, point-to-point, object-collective and functional-collective wrappers with
                    their records, Work.wait's hook, DataLoader epoch counting (Patcher.patch, loaders.install).
3 DDP/FSDP regions  + DDP.forward and FSDP2's pre-forward as regions, backward()'s gradient all-reduce record,
                    DDP's construction-time broadcasts and bucket rebuild (Patcher._patch_ddp_internals).
4 watchdog          + init/destroy_process_group wrapped, the watchdog thread started and stopped with its one-off
                    store writes (store client, first and exit states), signal handlers, the fault file; each
                    round polls completions and builds this rank's state as a shipped round would, and sends
                    nothing.
5 as shipped        + each round's store traffic: the publish, the counters, incident and mismatch looks. The
                    same as DDPWATCH=1 with no level (the benchmark runs it so).

Where a part's internals change, this module changes with them (tests/test_benchmarks.py runs it in quick mode,
and each rank reports what it had on, which the benchmark prints).
"""

from __future__ import annotations

import time

PLAIN, STARTUP, WRAPPERS, REGIONS, WATCHDOG, SHIPPED = range(6)
LEVELS = ("plain", "start-up", "wrappers", "DDP/FSDP regions", "watchdog", "store traffic")
ROWS = {  # what each level adds, as the attribution table names it
    STARTUP: "start-up (hook in every process, configuration, imports, session)",
    WRAPPERS: "wrappers (collective records, Work.wait hook, DataLoader epochs)",
    REGIONS: "DDP/FSDP regions (forward, backward's gradient all-reduce, construction)",
    WATCHDOG: "watchdog (thread, its rounds without the store, start/stop, signals)",
    SHIPPED: "store traffic (each round's publish, counters and looks)",
}


def switch_off_above(level: int) -> None:
    """Monkeypatch ddpwatch so that the parts above `level` do nothing; call before init_process_group."""
    from ddpwatch import session
    from ddpwatch.capture import loaders, wrappers
    from ddpwatch.watch import store, watchdog  # noqa: F401  (imported here at every level: start-up's share)

    nothing = lambda *args, **kwargs: None
    if level < WRAPPERS:
        wrappers.Patcher.patch = nothing  # type: ignore[method-assign]
        loaders.install = nothing
    if level < REGIONS:
        wrappers.Patcher._patch_ddp_internals = nothing  # type: ignore[method-assign]
    if level < WATCHDOG:
        session.Session._wrap_lifecycle = nothing  # type: ignore[method-assign]
        session.Session.arm = nothing  # type: ignore[method-assign]
    if level < SHIPPED:
        watchdog.Watchdog.tick = _tick_without_store  # type: ignore[method-assign]


def _tick_without_store(self) -> None:
    """Watchdog.tick less every store call: the completion poll, and the state a round builds (a beat alone while
    the rank runs, the whole state every few seconds, as StateReader decides), the positions it would send."""
    self.recorder.poll_pending()
    now = time.monotonic()
    self.mismatches.outgoing()
    if self.states.beat_is_enough(now):
        self.states.beat_round()
    else:
        self.states.heartbeat(now)
