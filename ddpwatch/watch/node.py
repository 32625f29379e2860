"""The node relay (issue 45): a node's running ranks reach the job's store through one of them, over local files.

A rank that runs has nothing to tell the job but that it lives, and needs from it only the counters (an incident
to answer, ranks waiting) and its partners' completed positions. So on a node of several ranks each running rank
writes what it would have put into the store to a file of its own, in a folder of this user's on this node
(`<tmp>/ddpwatch-<uid>/nodes/<job>/<node>/r<rank>.json`), and one of them, the node's leader, makes the node's
round trips for all of them: one read of the counters and of the partners' documents, and the documents that must
be in the store (the completed positions other ranks read; every staged position while some rank waits, so the
watching rank sees who runs). It leaves what it read in `relay.json`, which the node's other running ranks read
instead of the store. A rank newly blocked in a collective, or exiting, speaks to the store itself, as without the
relay: a hang's news never waits for a file; its later rounds, which change only its beat, go through a leader that
looks (NodeRelay.carries), so that a hang's steady load is per node too.

The leader is the lowest local rank whose own file is fresh and whose process is alive: a leader that dies is
replaced at the next round (its pid is gone), one that hangs or stops once its file is older than `STALE_ROUNDS`
rounds, well inside `dead_after` (at least 3 rounds), so the node's other ranks are never taken for silent.
Every file is written whole (atomic.write_file) and read with a size bound; a file that is not one is skipped.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import socket
import time
from collections.abc import Mapping

import psutil

from .. import atomic, private
from ..analysis import is_blocked
from ..format import build, validate
from ..logonce import log_once

CHECK_EVERY = 16  # a live lower rank's start time is asked again once in this many rounds (a reused pid)
STALE_ROUNDS = 2.5  # a rank whose file is this many rounds old cannot lead (a late round under load is not)
MAX_FILE_BYTES = 4 << 20  # a rank's staged documents: a few KiB, its whole state with history tens of KiB
# A post this recent stands in for a blocked rank's own read of the counters: a blocked leader posts at each of its
# looks for an incident (every 0.1 s, watchdog.FAST_S), so its node's blocked ranks poll a file, not the store;
# older (a leader that runs posts once a round) and the blocked rank reads the store itself, as without the relay.
FRESH_POST_S = 0.3
# The looks a hang's blocked leaders make at the store, the whole job's, at most this many a second: a blocked leader
# looks at each of its looks for an incident (ten a second) where the job has up to JOB_LOOKS_PER_S / 10 nodes; past
# that it reads the store every nodes / JOB_LOOKS_PER_S seconds (8,192 nodes: every 0.5 s) and its own post between,
# and its posts stay fresh three of its reads long. Without it a hang's first 10 s at 8,192 nodes asked the server
# 82,000 reads a second, past what its one thread serves (docs/scale.md); the price is an incident read later there.
JOB_LOOKS_PER_S = 16384
# The leader puts its ranks' documents at most twice a round: a beat a round is what a blocked or running rank adds,
# and a rank's news (newly blocked, blocked somewhere new, exited) does not wait for it (NodeRelay.carries).
PUT_EVERY_ROUNDS = 0.5
RELAY_FILE = "relay.json"
_RANK_FILE = re.compile(r"r(\d{1,7})\.json")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def node_of(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """(this rank's node, its ranks' count) under torchrun (GROUP_RANK, LOCAL_WORLD_SIZE, set by its agent for
    each worker), else None: a node is this host's name and the agent's group, so two agents on one host are two
    nodes, as torchrun counts them."""
    environ = os.environ if environ is None else environ
    group, local = environ.get("GROUP_RANK", ""), environ.get("LOCAL_WORLD_SIZE", "")
    if not (group.isdigit() and local.isdigit() and int(local) > 0):
        return None
    return f"{socket.gethostname()}-{int(group)}", int(local)


def relay_on(option: str, world_size: int, environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The node to relay for, or None: `relay` on, or auto where the job spans nodes (fewer local ranks than ranks),
    under torchrun; off, a node of one rank, or a launcher that does not say where the rank runs: no relay."""
    node = node_of(environ)
    if option == "off" or node is None or node[1] < 2:
        return None
    return node if option == "on" or node[1] < world_size else None


def read_by_others(rank: int, groups: Mapping, world_size: int) -> bool:
    """Whether some rank reads this one's completed positions: each rank reads the lowest other rank of its groups
    (fingerprints.MismatchCheck.partners), which is one of a group's two lowest ranks."""
    if world_size > 1 and rank < 2:
        return True  # the default group's two lowest (every rank's partner is rank 0, rank 0's is rank 1)
    # a group's two lowest, without building the world's ranks (this runs every round, on every rank)
    return any(ranks is not None and len(ranks) > 1 and rank in heapq.nsmallest(2, ranks) for ranks in groups.values())


def relay_for(config, store, rank: int, world_size: int, groups, logged: set, environ=None):
    """This rank's NodeRelay where its node relays (the `relay` option), else None; a node folder that cannot be
    made is one warning, and no relay."""
    node = relay_on(config.relay, world_size, environ)
    if node is None:
        return None
    try:
        job = f"{store.job_token}-{store.key('relay')}"
        return NodeRelay(job, node[0], rank, config, world_size, groups, local_ranks=node[1])
    except OSError as exc:
        log_once(logged, "relay", "ddpwatch: no node relay (%s); this rank uses the store itself", exc)
        return None


class NodeRelay:
    """This rank's end of its node's relay: stages its documents, elects the leader, posts and reads the relay."""

    def __init__(self, job: str, node: str, rank: int, config, world_size: int, groups, local_ranks: int = 1):
        self.rank = rank
        self.interval, self.grace = config.interval, config.grace
        self.world_size = world_size
        nodes = -(-world_size // max(1, local_ranks))  # torchrun gives every node the same number of ranks
        # seconds between two of this node's reads as its blocked leader: 0, every look, while the job's nodes'
        # ten looks a second (watchdog.FAST_S) fit in JOB_LOOKS_PER_S
        self.read_every = nodes / JOB_LOOKS_PER_S if nodes * 10 > JOB_LOOKS_PER_S else 0.0
        self.fresh_for = max(FRESH_POST_S, 3 * self.read_every)  # how old a post may be and still stand in
        self._read_at = -float("inf")  # when (monotonic) this rank, leading, last read the store for its node
        self.groups = groups  # {group name: its ranks}: the recorder's live view
        self.folder = private.open_private("nodes", _safe(job), _safe(node))
        self._pid, self._started = os.getpid(), _start_time(os.getpid())
        self._put_last: dict = {}  # key -> text, what this rank last put for its node as its leader
        self._put_at = -float("inf")  # when (monotonic) it last put them
        self._known: dict = {}  # rank -> (pid, start time, checks since read): a lower rank found alive

    # ----- every rank -----
    def carries(self, state, blocked: bool, where_unchanged: bool) -> bool:
        """Whether a state goes through the relay: a rank that runs; a rank `blocked` in a collective (self.blocked)
        whose place is the one it last put in the store itself (`where_unchanged`: only its beat and ages have moved
        since), while its leader's post is fresh (a leader that looks, which it does ten times a second when blocked
        itself, as in a hang). A rank newly blocked, blocked somewhere new, or exiting puts its own: a hang's news
        never waits for a file, only its beats do."""
        if state.get("status") != build.RUNNING:
            return False
        return not blocked or (where_unchanged and self.fresh(self.posted()))

    def blocked(self, state) -> bool:
        """Whether a rank waits in a collective past grace (analysis.is_blocked): its leader puts what it carries of
        it whether or not the counters say that someone waits."""
        return is_blocked(state, self.grace)

    def stage(self, docs: Mapping[str, object], wants: list, direct: bool, blocked: bool = False) -> None:
        """This rank's documents of this round (`direct`: it put them itself; `blocked`: it waits in a collective,
        so its leader puts them whether or not the counters say someone waits), written every round: a fresh file is
        how its node sees it live."""
        body = {
            "rank": self.rank,
            "pid": self._pid,
            "started": self._started,
            "docs": {key: doc if isinstance(doc, str) else json.dumps(doc) for key, doc in docs.items()},
            "wants": wants,
            "direct": direct,
            "blocked": blocked,
            "read_by_others": read_by_others(self.rank, self.groups, self.world_size),
        }
        atomic.write_file(self.folder, f"r{self.rank}.json", json.dumps(body).encode(), 0o600, f".r{self.rank}.tmp")

    def leader(self, now: float | None = None) -> int | None:
        """The lowest local rank whose file is fresh and whose process lives (None: no rank has staged yet)."""
        now = time.time() if now is None else now
        fresh = []
        for name in os.listdir(self.folder):
            match = _RANK_FILE.fullmatch(name)
            if match is None:
                continue
            try:
                age = now - os.stat(name, dir_fd=self.folder, follow_symlinks=False).st_mtime
            except OSError:
                continue
            if age < STALE_ROUNDS * self.interval:
                fresh.append(int(match[1]))
        for rank in sorted(fresh):
            if rank == self.rank or self._lives(rank):
                return rank
        return None

    def posted(self) -> dict:
        """The leader's last post ({} before the first, or when it does not read as one)."""
        body = self._read(RELAY_FILE)
        return body if isinstance(body, dict) else {}

    def fresh(self, post: dict, now: float | None = None) -> bool:
        """Whether a post is recent enough (`fresh_for`: FRESH_POST_S, longer in a job of many nodes) to stand in for
        a blocked rank's own read of the counters."""
        at = post.get("at")
        if not isinstance(at, (int, float)) or isinstance(at, bool):
            return False
        return 0.0 <= (time.time() if now is None else now) - at <= self.fresh_for

    def read_due(self, post: dict) -> bool:
        """Whether this rank, leading in a job of many nodes (`read_every` > 0), reads the store for its node at this
        look, or takes its own `post`: every `read_every` seconds, and whenever its post is not fresh (its first
        look, or a read that failed)."""
        now = self.clock()
        if now - self._read_at < self.read_every and self.fresh(post):
            return False
        self._read_at = now
        return True

    @staticmethod
    def read_post(post: dict, world_size: int) -> tuple:
        """(the counters' value or None, {rank: partner document}) of a post, each document checked as one read
        from the store is (validate.fingerprint_problem, and that it names its own rank)."""
        value, posted, documents = post.get("counters"), post.get("fingerprints"), {}
        for key, doc in (posted if isinstance(posted, dict) else {}).items():
            if str(key).isdigit() and isinstance(doc, dict) and doc.get("rank") == int(key):
                if validate.fingerprint_problem(doc, world_size) is None:
                    documents[int(key)] = doc
        return (value if type(value) is int else None), documents

    def close(self) -> None:
        """This rank leaves its node's relay (it exits): its file goes, the node's next rank leads."""
        private.remove_quietly(self.folder, f"r{self.rank}.json")
        os.close(self.folder)

    # ----- the node's leader -----
    def staged(self) -> dict:
        """{rank: its staged body} of every local rank's file that reads as one."""
        found = {}
        for name in os.listdir(self.folder):
            match = _RANK_FILE.fullmatch(name)
            if match is None:
                continue
            body = self._read(name)
            if isinstance(body, dict) and isinstance(body.get("docs"), dict) and body.get("rank") == int(match[1]):
                found[body["rank"]] = body
        return found

    def to_put(self, staged: dict, looking: bool, namespace: str) -> dict:
        """{key: text} the leader puts for its carried ranks this round: every document that changed of a blocked
        rank, and, while some rank waits (`looking`), of every running rank, so the watching rank sees who runs; else
        only the completed positions of the ranks other ranks read (read_by_others). Keys outside this job's
        namespace are never put. Nothing before PUT_EVERY_ROUNDS of a round since the last put: a blocked leader
        comes here at each of its looks, ten a round, and what changes between them is beats."""
        if self.clock() - self._put_at < PUT_EVERY_ROUNDS * self.interval:
            return {}
        docs = {}
        for body in staged.values():
            if body.get("direct") is not False:
                continue  # a rank that waits somewhere new, or exits, put its own
            for key, text in body["docs"].items():
                read = body.get("read_by_others") is True and key.rpartition("/")[0].endswith("/fp")
                if (looking or read or body.get("blocked") is True) and type(text) is str:
                    if key.startswith(namespace + "/") and self._put_last.get(key) != text:
                        docs[key] = text
        return docs

    def put_done(self, docs: dict) -> None:
        self._put_at = self.clock()
        self._put_last = {**self._put_last, **docs} if len(self._put_last) < 1024 else dict(docs)

    @staticmethod
    def wanted(staged: dict, world_size: int) -> list:
        """The partners whose documents the node's running ranks read, for the leader to read once for all."""
        wants = {r for body in staged.values() if isinstance(body.get("wants"), list) for r in body["wants"]}
        return sorted(r for r in wants if type(r) is int and 0 <= r < world_size)

    def post(self, counters: int | None, fingerprints: Mapping, leader_beat: int | None = None) -> None:
        """What the leader read this round, for the node's other ranks: the counters, the partners' documents, and
        rank 0's beat number, which a blocked rank reads each round to know that rank 0 still watches."""
        body = {
            "leader": self.rank,
            "at": time.time(),  # this node's clock, read on this node: fresh() compares like with like
            "counters": counters,
            "leader_beat": leader_beat,
            "fingerprints": {str(r): d for r, d in fingerprints.items()},
        }
        atomic.write_file(self.folder, RELAY_FILE, json.dumps(body).encode(), 0o600, f".relay.{self.rank}.tmp")

    @staticmethod
    def leader_beat_of(post: dict) -> int | None:
        """Rank 0's beat number as the leader last read it, or None (not read, or not a number)."""
        beat = post.get("leader_beat")
        return beat if type(beat) is int and beat >= 0 else None

    @staticmethod
    def clock() -> float:
        """The pace of the leader's reads and puts (monotonic); benchmarks/store_load.py plays a node's looks back to
        back and gives its relays the time they would stand for."""
        return time.monotonic()

    # ----- files -----
    def _lives(self, rank: int) -> bool:
        """Whether the process that wrote a rank's file lives (the same process: its start time too, against a
        reused pid). Its file is read, and the start time asked of the system, once every CHECK_EVERY calls; in
        between, whether its pid still exists (a signal 0: no file read, no /proc parsed each round)."""
        known = self._known.get(rank)
        if known is not None and known[2] % CHECK_EVERY and _exists(known[0]):
            self._known[rank] = (known[0], known[1], known[2] + 1)
            return True
        body = self._read(f"r{rank}.json")
        pid = body.get("pid") if isinstance(body, dict) else None
        started = _start_time(pid) if type(pid) is int else None
        if started is None or started != body.get("started"):
            self._known.pop(rank, None)
            return False
        self._known[rank] = (pid, started, 1)
        return True

    def _read(self, name: str):
        try:
            fd = os.open(name, os.O_RDONLY | private.NOFOLLOW, dir_fd=self.folder)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
            return json.loads(data) if len(data) <= MAX_FILE_BYTES else None
        except (OSError, ValueError):
            return None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # there, another user's: the start time check will tell
    return True


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError, ValueError):
        return None


def _safe(name: str) -> str:
    """A name for a folder of ours: what is not a letter, digit, dot, dash or underscore becomes one underscore."""
    return _UNSAFE.sub("_", name)[:120] or "_"
