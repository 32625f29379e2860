"""Finds rank snapshots written separately (rank-<r>.json, maybe on several hosts) and merges them into one incident."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

from ..analysis import incident
from ..format import bounded, documents
from ..format.version import FormatError
from ..static import rankcond

if TYPE_CHECKING:  # annotations only: the named shapes cost nothing at run time
    from ..format.types import Incident, IncidentSource

RANK_FILE = re.compile(r"^rank-(\d+)\.json$")
PROGRESS_FROM = 64  # files; below this a progress bar is noise


class MergeError(FormatError):
    """Rank files that cannot make one incident (none found, or from different jobs)."""


def _walk_rank_files(folder: str) -> tuple:
    """(rank files under folder, folders holding a report.json); hidden folders (half-written staging) and what is not
    a regular file (a FIFO would block the read) skipped."""
    files: list = []
    incidents: list = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if documents.REPORT_JSON in names:
            incidents.append(root)
        files.extend(
            path
            for path in (os.path.join(root, name) for name in sorted(names) if RANK_FILE.match(name))
            if bounded.regular_or_skipped(path)
        )
    return files, incidents


def find_rank_files(paths: list) -> list:
    """Every rank-<r>.json under the given folders (recursively), plus the files named directly."""
    found = []
    for path in paths:
        if not os.path.exists(path):
            raise MergeError(f"{path}: no such file or folder")
        if not os.path.isdir(path):
            found.append(path)  # named: read, or refused in one line if it is no regular file (a FIFO would block)
            continue
        files, incidents = _walk_rank_files(path)
        if len(incidents) > 1:
            raise MergeError(
                f"{path} holds {len(incidents)} incident folders ({incidents[0]}, {incidents[1]}, ...);"
                " name the one to render"
            )
        if not files:
            raise MergeError(f"{path}: no report.json or rank-<r>.json found under it")
        found.extend(files)
    return found


def _newer(candidate: dict, current: dict) -> bool:
    """Whether a second snapshot of the same rank replaces the first: the later heartbeat wins, then the later clock."""

    def order(doc):
        return (doc.get("beat") or 0, doc.get("published_at") or 0.0)

    return order(candidate) >= order(current)


def _progress(files: list):
    if len(files) < PROGRESS_FROM:
        return files
    from tqdm import tqdm

    return tqdm(files, desc="ddpwatch: reading rank files", unit="file", file=sys.stderr, leave=False)


def load_rank_files(files: list) -> dict:
    """rank -> (snapshot, path), one per rank (the later of duplicates); MergeError for files of different runs."""
    chosen: dict = {}
    runs: dict = {}  # each run named by a file -> the first file naming it
    conflict = ""  # the first rank two processes wrote: said once every run is known
    for path in _progress(files):
        doc = documents.load_document(path)
        if not documents.is_rank_snapshot(doc):
            raise MergeError(f"{path}: not a ddpwatch rank snapshot (expected a rank-<r>.json file)")
        if isinstance(doc.get("run"), str):
            runs.setdefault(doc["run"], path)
        rank = doc["rank"]
        if rank in chosen:
            conflict = conflict or _other_process(rank, (doc, path), chosen[rank])
        if rank not in chosen or _newer(doc, chosen[rank][0]):
            chosen[rank] = (doc, path)
    if len(runs) > 1:
        named = "; ".join(f"{run} ({path})" for run, path in runs.items())
        raise MergeError(
            f"the files are of {len(runs)} runs: {named}. Name the folder of one run: "
            f"ddpwatch report {os.path.dirname(next(iter(runs.values()))) or '.'}"
        )
    if conflict:
        raise MergeError(conflict)
    return chosen


def _other_process(rank: int, one: tuple, other: tuple) -> str:
    """Two snapshots of one rank merge only when one process wrote both (its later heartbeat wins): another pid or
    host is another run, whatever the files say (files written before runs were named carry no run). The error's
    words, or ''."""
    (doc, path), (seen, seen_path) = one, other
    if (doc.get("host"), doc.get("pid")) == (seen.get("host"), seen.get("pid")):
        return ""
    return (
        f"rank {rank} is two processes: pid {seen.get('pid')} on {seen.get('host')} ({seen_path}) and pid "
        f"{doc.get('pid')} on {doc.get('host')} ({path}): files of different runs. Name the folder of one run"
    )


def common_world_size(chosen: dict) -> int:
    """The one world_size every rank file states; different ones mean files of different jobs."""
    sizes: dict = {}
    for _rank, (doc, path) in sorted(chosen.items()):
        sizes.setdefault(doc.get("world_size"), path)
    if len(sizes) != 1:
        described = ", ".join(f"{size} ({path})" for size, path in sizes.items())
        raise MergeError(f"the rank files disagree on world_size: {described}; merge the files of one job only")
    [world_size] = sizes
    if not isinstance(world_size, int) or world_size < 1:
        raise MergeError(f"{next(iter(sizes.values()))}: world_size {world_size!r} is not a positive integer")
    outside = [(rank, path) for rank, (_, path) in chosen.items() if not 0 <= rank < world_size]
    if outside:
        raise MergeError(f"{outside[0][1]}: rank {outside[0][0]} is outside world_size {world_size}")
    return world_size


def incident_from_states(
    states: dict,
    world_size: int,
    grace: float,
    timeout: float,
    source: IncidentSource,
    created_at: float | None = None,
) -> Incident:
    """An incident document from rank snapshots, with ddpwatch's analysis run over them (and the rank conditions
    over their stacks read from the sources here, as the watchdog does, so the incident keeps them)."""
    return incident.build(
        states,
        world_size,
        grace,
        timeout,
        source=source,
        created_at=created_at,
        rank_conditions=rankcond.capture_rank_conditions(states),
    )


def merged_incident(
    paths: list, grace: float = incident.DEFAULT_GRACE, timeout: float = incident.DEFAULT_TIMEOUT
) -> Incident:
    """`ddpwatch report A B ...`: every rank file under the paths, merged, analysed again."""
    chosen = load_rank_files(find_rank_files(paths))
    world_size = common_world_size(chosen)
    states = {rank: doc for rank, (doc, _) in chosen.items()}
    source: IncidentSource = {
        "kind": "rank_files",
        "files": [os.path.abspath(path) for _, (_, path) in sorted(chosen.items())],
    }
    return incident_from_states(states, world_size, grace, timeout, source)
