"""Which peers are silent, vanished, busy or frozen, and for how long: published states judged at a given `now`."""

from __future__ import annotations

from ..format import build
from . import evidence

VANISHED_AFTER_INTERVALS = 3  # a remote peer's heartbeat still this many rounds after a collective failed: vanished


class PeerTracker:
    """Remembers when each peer's heartbeat last moved, and the last process look at each silent local peer.

    Every judgement takes `now` (this rank's monotonic clock: clocks across hosts are never compared); the only
    outside read is `look(pid)`, psutil's facts about a local process (evidence.peer_process_facts by default)."""

    def __init__(self, rank: int, world_size: int, host: str, config, look=None):
        self.rank = rank
        self.world_size = world_size
        self.host = host
        self.config = config
        self._look = look
        self.beats: dict = {}  # rank (or "leader") -> (beat, when it was first seen)
        self.looks: dict = {}  # rank -> (pid, psutil facts, when) of the last look while silent

    def silent_for(self, rank, doc: dict | None, now: float) -> float:
        """Seconds since `rank`'s heartbeat last moved (0 the first time it is seen, and for a rank that exited)."""
        beat = doc.get("beat") if doc else None
        if doc and doc.get("status") == build.EXITED:
            return 0.0
        last = self.beats.get(rank)
        if last is None or last[0] != beat:
            self.beats[rank] = (beat, now)
            return 0.0
        return now - last[1]

    def leader_silent(self, leader_beat, read_lower, now: float) -> bool:
        """Whether rank 0's heartbeat counter and every rank between it and this one have been still for
        dead_after: then this rank is the lowest one alive and watches in rank 0's place. `read_lower()` gives the
        states of ranks 1 .. rank-1, read only once rank 0 has gone silent (normally one counter is all it costs)."""
        if self.silent_for("leader", {"beat": leader_beat}, now) < self.config.dead_after:
            return False
        lower = read_lower()
        return all(self.silent_for(r, lower.get(r), now) >= self.config.dead_after for r in range(1, self.rank))

    def silent_peers(self, states: dict, now: float) -> dict:
        """Peers whose heartbeat has not moved for dead_after seconds (or never came) and that may be judged now.

        A silent heartbeat alone proves nothing: one long C call that holds the GIL (computing, or asleep in the
        kernel) silences the watchdog thread of a healthy rank. So before `timeout` only a peer that psutil sees
        gone, stopped, traced or dead is reported; any other silent peer, and one on another host or that psutil
        cannot look at, counts as busy: it is left out of the answer and its stale state in `states` is replaced by
        a busy one (see busy_state), so only the straggler timeout can report on it, like any busy rank.
        """
        silent = {}
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            quiet = self.silent_for(rank, states.get(rank), now)
            if quiet < self.config.dead_after:
                self.looks.pop(rank, None)  # CPU use is measured within one silence, from its first look
                continue
            view = self._judge_silent(rank, states, quiet, now)
            if view is not None:
                silent[rank] = view
        return silent

    def _judge_silent(self, rank: int, states: dict, quiet: float, now: float) -> dict | None:
        """The view of one peer silent for `quiet` seconds, or None (and its state made busy) when it is busy."""
        last = states.get(rank)
        view = {"silent_s": round(quiet, 1), "last_state": last}
        if last is None:
            view["never_published"] = True
        elif last.get("host") == self.host:
            process = view["process"] = self.look_at_peer(rank, int(last.get("pid", 0)), now)
            condition = (process or {}).get("condition")
            if condition in (evidence.BUSY, evidence.WAITING) or (
                condition not in (evidence.GONE, evidence.FROZEN) and quiet < self.config.timeout
            ):
                states[rank] = busy_state(last)  # at most a straggler, reported by the timeout stage
                return None
        elif quiet < self.config.timeout:
            states[rank] = busy_state(last)  # another host: psutil cannot tell busy from frozen there
            return None
        else:
            view["remote"] = True  # silent past the timeout: reported, saying busy and dead look the same
        return view

    def look_at_peer(self, rank: int, pid: int, now: float) -> dict | None:
        """psutil's facts about a silent local peer, judged busy or frozen against the previous look at it."""
        facts = self._facts(pid)
        previous = self.looks.get(rank)
        self.looks[rank] = (pid, facts, now)
        if facts is None:
            return None
        before, seconds = (previous[1], now - previous[2]) if previous and previous[0] == pid else (None, 0.0)
        judged = evidence.peer_condition(facts, before, seconds)
        return dict(facts, condition=judged["condition"], why=judged["why"], cpu_share=judged["cpu_share"])

    def vanished_peers(self, positions: dict, now: float) -> dict:
        """After a collective failed on a peer: the peers psutil sees gone on this host, and remote peers whose
        heartbeat (in `positions`, published every round) has been still for VANISHED_AFTER_INTERVALS rounds. Each
        one's `last_state` is its last position (JobProtocol.with_history adds its history)."""
        silent = {}
        for rank in range(self.world_size):
            last = positions.get(rank)
            if rank == self.rank or not last or last.get("status") == build.EXITED:
                continue
            quiet = self.silent_for(rank, last, now)
            process = self._facts(int(last.get("pid", 0))) if last.get("host") == self.host else None
            gone = (process or {}).get("exists") is False
            if gone or (process is None and quiet >= VANISHED_AFTER_INTERVALS * self.config.interval):
                silent[rank] = {
                    "silent_s": round(quiet, 1),
                    "last_state": last,
                    "process": process,
                    "remote": process is None,
                }
        return silent

    def _facts(self, pid: int) -> dict | None:
        return (self._look or evidence.peer_process_facts)(pid)  # looked up per call: tests replace evidence's


def busy_state(last: dict) -> dict:
    """A busy peer's last published state, without its in-flight records: those may be from before it went
    busy (the barrier it just left), and a stale wait must never count as blocked or prove a deadlock."""
    return dict(last, inflight=[])
