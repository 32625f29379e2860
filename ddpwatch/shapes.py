"""The named shapes of the plain data passed between stages: what a record, a rank state, a finding and an incident hold.

JSON-native TypedDicts (no torch, no runtime cost): the stages pass these dicts, files hold them, and schema.py
checks them when they come from outside. Optional keys live in the total=False half of each pair.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict


class Site(TypedDict):
    """A line of code: where the user's call was, or a framework's frame it went through."""

    file: str
    line: int
    function: str


class Via(Site):
    package: str  # the installed framework the user's call went through ("lightning")


class Region(TypedDict):
    """What a record happened inside of: DDP.forward, FSDP2's pre-forward, an object collective."""

    kind: str  # snapshot.DDP_FORWARD, FSDP_FORWARD, OBJECT_COLLECTIVE
    site: Optional[Site]
    api: str


class _RecordBase(TypedDict):
    seq: int
    group: str
    op: str
    api: str
    p2p: bool
    peer: Optional[int]
    shapes: List[List[int]]
    dtypes: List[str]
    site: Optional[Site]
    region: Optional[Region]
    start: float
    age_s: float
    duration_s: Optional[float]
    state: str  # snapshot.IN_FLIGHT, COMPLETED, FAILED, UNTRACKED
    error: Optional[str]
    thread: str


class RecordDoc(_RecordBase, total=False):
    """One collective as a rank issued it (record.Record.to_dict())."""

    via: Optional[Via]
    framework: Dict[str, Any]  # frameworks.framework_context(): Lightning's deferred log reduction
    flight_recorder: Dict[str, Any]  # the Flight Recorder entry paired with it, or the one it came from


class RankCondition(TypedDict):
    frame: Site
    condition: Dict[str, Any]  # {"line", "text", "kind"}, from rankcond.rank_condition_at


class _RankStateBase(TypedDict):
    format_version: int
    rank: int
    world_size: int
    pid: int
    host: str
    beat: int
    published_at: float
    status: str  # snapshot.RUNNING, EXITED
    progress: int
    idle_s: float
    inflight: List[RecordDoc]
    recent: List[RecordDoc]


class RankState(_RankStateBase, total=False):
    """What one rank publishes every interval; the full form (an incident's answer) adds stacks and evidence."""

    last_seq: Dict[str, int]
    groups: Dict[str, Optional[List[int]]]
    ops_recorded: int
    ddp_steps: int
    site_counts: Dict[str, int]
    rank_condition: Optional[RankCondition]
    stacks: List[Dict[str, Any]]
    process: Optional[Dict[str, Any]]
    progress_bars: List[Dict[str, Any]]
    flight_recorder: Dict[str, Any]
    native: Dict[str, Any]
    stale: bool


class Finding(TypedDict):
    """One verdict (snapshot.finding()): its kind, the culprit ranks, what happened, the fix, the user's line."""

    kind: str  # one of snapshot.FINDING_KINDS
    ranks: List[int]
    summary: str
    fix: str
    location: Optional[Site]
    evidence: Dict[str, Any]


class _IncidentBase(TypedDict):
    format_version: int
    run_id: str
    world_size: int
    created_at: float
    trigger: str  # analysis.DEADLOCK, TIMEOUT, SILENT, DUMP
    written_by: Optional[int]
    grace: float
    timeout: float
    ranks: List[RankState]
    missing_ranks: List[int]
    findings: List[Finding]


class Incident(_IncidentBase, total=False):
    """One report (incident.build()): every rank's state, the findings, and where it came from."""

    silent: Dict[str, Dict[str, Any]]
    source: Dict[str, Any]
    report_dir: str
