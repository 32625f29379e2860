"""The named shapes of the plain data passed between stages: what a record, a rank state, a finding, an incident hold.

JSON-native TypedDicts (no torch, no runtime cost): the stages pass these dicts, files hold them, and validate.py
derives its checks of files from them, so each field is defined here only. A type says what a stage may be handed:
what ddpwatch writes, or what `ddpwatch report` accepts from a file (version-1 files of older writers and Flight
Recorder input leave some fields null; counts marked float may be any JSON number). Keys always written live in
the first half of each pair, optional ones in its total=False half. A field typed with Any is kept but not
interpreted (validate.py limits only its size and depth). Bounds, list sizes and the keys a reader insists on are
validate.py's.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict


class Site(TypedDict):
    """A line of code: where the user's call was, or a framework's frame it went through."""

    file: str
    line: Optional[int]  # null: a Flight Recorder frame without one
    function: str


class Via(Site):
    package: str  # the installed framework the user's call went through ("lightning")


class Region(TypedDict):
    """What a record happened inside of: DDP.forward, FSDP2's pre-forward, an object collective."""

    kind: str  # build.DDP_FORWARD, FSDP_FORWARD, OBJECT_COLLECTIVE
    site: Optional[Site]
    api: Optional[str]


class _RecordBase(TypedDict):
    seq: int
    group: str
    op: str
    api: Optional[str]
    p2p: bool
    peer: Optional[int]
    shapes: List[List[int]]
    dtypes: List[str]
    site: Optional[Site]
    region: Optional[Region]
    start: Optional[float]  # epoch seconds
    age_s: float
    duration_s: Optional[float]
    state: str  # build.IN_FLIGHT, COMPLETED, FAILED, UNTRACKED
    error: Optional[str]
    thread: Optional[str]


class P2POpDoc(TypedDict):
    """One send or receive of a batch_isend_irecv list."""

    op: str  # "send" | "recv"
    peer: int  # a rank of the default group
    tag: Optional[int]


# What point-to-point records add (functional form: `async` is a Python keyword); `async` and `waited` also on a
# collective whose call returned while its op is pending (async_op=True, a functional collective).
_P2PFields = TypedDict(
    "_P2PFields",
    {
        "tag": Optional[int],  # null: unknown (a Flight Recorder record, an unreadable tag)
        "ops": List[P2POpDoc],  # batch_isend_irecv: its sends and receives
        "async": bool,  # the call returned a Work (isend, async_op=True) or a pending tensor (functional) to the user
        "waited": bool,  # a thread is blocked in that Work's wait() (or wait_tensor() on that tensor) now
        "origin": str,  # the library whose schedule issued it ("torch.distributed.pipelining")
    },
    total=False,
)


class RecordDoc(_RecordBase, _P2PFields, total=False):
    """One collective as a rank issued it (build.record(): record.Record.to_dict() and the Flight Recorder readers)."""

    via: Optional[Via]
    framework: Dict[str, Any]  # frameworks.framework_context(): Lightning's deferred log reduction
    flight_recorder: Dict[str, Any]  # the Flight Recorder entry paired with it, or the one it came from
    fr: Dict[str, Any]  # records read from a Flight Recorder dump: torch's own fields (record_id, state ...)


class _FrameBase(Site):
    internal: bool  # torch, ddpwatch or the standard library: not the user's code


class Frame(_FrameBase, total=False):
    """One frame of a stack."""

    library: bool  # an installed package's frame (frames.classify)


class _StackBase(TypedDict):
    thread: Optional[str]
    main: bool
    frames: List[Frame]  # outermost first


class Stack(_StackBase, total=False):
    """One thread's stack."""

    source: str  # where frames came from when not from the live process ("flight_recorder frames of ...")


class ProcessFacts(TypedDict, total=False):
    """psutil's view of a rank's process (evidence.ProcessSampler), or why there is none."""

    status: Optional[str]
    cpu_percent: Optional[float]
    rss_mb: Optional[float]
    threads: Optional[int]
    exists: Optional[bool]  # written by earlier versions
    error: Optional[str]


class ProgressBar(TypedDict):
    """A live tqdm bar of a rank (evidence.progress_bars())."""

    desc: Optional[str]
    n: Optional[int]
    total: Optional[int]
    since_update_s: Optional[float]


class RankCondition(TypedDict):
    """The rank condition a rank's code stands under (static.rankcond), read from the sources when it was seen."""

    frame: Site
    condition: Dict[str, Any]  # {"line", "text", "kind"}, from static.rankcond.rank_condition_at


class CodeCondition(TypedDict):
    """The innermost `if` over an exit (static.exits): its line, its header's text, whether it is a rank condition."""

    line: int
    text: str
    rank: bool  # passed by some ranks only by construction (static.rankcond): the rank-condition rules' business
    branch: str  # "if" (the exit is in its body) or "else"


class CodeLine(TypedDict):
    """A line of the user's source: an `except` line an exit sits in."""

    line: int
    text: str


class CodeDecidedIn(TypedDict):
    """The `return` of a helper whose constant value an exit's condition tests (`x = helper()`, `if x is None:`)."""

    line: int
    function: str
    text: str
    condition: CodeCondition


class _CodeExitBase(TypedDict):
    line: int
    kind: str  # "break", "continue", "return"
    condition: Optional[CodeCondition]
    handler: Optional[CodeLine]  # the `except` it sits in, inside the loop


class CodeExit(_CodeExitBase, total=False):
    """A way out of a loop: a `break` or `continue` aimed at it, or a `return` inside it."""

    decided_in: CodeDecidedIn  # where the value its condition tests was decided


class _CodeLoopBase(TypedDict):
    line: int
    end: int
    text: str
    endless: bool  # `while True:`, `for ... in itertools.count():`: it ends by an exit only
    exits: List[CodeExit]


class CodeLoop(_CodeLoopBase, total=False):
    counted: bool  # its iterator yields as many items on every rank (`range(10)`): it cannot run out on one first


class _CodeHandlerBase(CodeLine):
    then: str  # what it does last: continue, break, return, raise, pass, falls (goes on after the try)


class CodeHandler(_CodeHandlerBase, total=False):
    end: int  # its last line


class CodeTry(TypedDict):
    line: int
    body_end: int
    handlers: List[CodeHandler]


class _CodeAroundBase(TypedDict):
    function: List[int]  # first and last line of the function holding it (the module: the whole file)
    loops: List[CodeLoop]  # innermost first
    tries: List[CodeTry]  # try blocks whose body holds the line, innermost first


class CodeAround(_CodeAroundBase, total=False):
    """What encloses one line of the user's source (static.exits.code_around), read when the incident was taken."""

    returns: List[CodeExit]  # the function's own `return`s (not nested functions'), with the `if` over each


class _LoaderEpochsBase(TypedDict):
    loader: int  # the order in which this rank first iterated it
    epochs: int  # how many times it was iterated
    steps: List[int]  # DDP training steps in each of its last epochs, oldest first; the last one runs until now


class LoaderEpochs(_LoaderEpochsBase, total=False):
    """One DataLoader's epochs on a rank (capture/loaders.py)."""

    length: int  # len(loader) when its last epoch began: the batches an epoch yields (absent: it has none)


class _IteratorSeenBase(TypedDict):
    file: str  # the user's frame that holds it
    function: str
    name: str  # the local variable
    kind: str  # "generator stream()", "DataLoader iterator", "itertools.cycle", "list_iterator" ...
    ended: bool  # it had run out when the incident was taken


class IteratorSeen(_IteratorSeenBase, total=False):
    """An iterator a local of the main thread's user frames held when an incident was taken (capture/iterators.py)."""

    at_line: int  # a suspended generator: the line it waits at
    yielded: int  # a DataLoader iterator: batches it gave, of `length`
    length: int
    left: int  # another iterator: the items it says are left (length_hint)


class _RankStateBase(TypedDict):
    format_version: int
    rank: int
    world_size: int
    pid: Optional[int]  # null: Flight Recorder input
    host: Optional[str]
    beat: Optional[float]  # a count
    published_at: Optional[float]  # epoch seconds
    status: str  # build.RUNNING, EXITED
    progress: Optional[float]  # a count
    idle_s: float
    inflight: List[RecordDoc]
    recent: List[RecordDoc]


class FingerprintSignature(TypedDict, total=False):
    """What must agree across ranks at one completed position (watch/fingerprints.py; analysis/silent.py)."""

    op: Optional[str]
    reduce: Optional[str]
    dtypes: List[str]
    counts: List[int]
    site: Optional[Site]
    region: Optional[str]
    root: Any  # the global rank, ["group", rank in the group], or null


class _FingerprintGroupBase(TypedDict):
    first: int
    ids: List[int]


class FingerprintGroup(_FingerprintGroupBase, total=False):
    """One group's newest completed positions: one signature id per position from `first` (-1: a gap)."""

    steps: List[Optional[int]]
    epoch: Optional[int]
    unaligned_from: int


class _FingerprintDocBase(TypedDict):
    v: int
    groups: Dict[str, FingerprintGroup]


class FingerprintDoc(_FingerprintDocBase, total=False):
    """A rank's completed positions as it publishes them (fp/<r>) and answers them (RankState.fingerprints)."""

    n: int
    rank: int
    signatures: Dict[str, FingerprintSignature]


class RankState(_RankStateBase, total=False):
    """What one rank publishes every interval; the full form (an incident's answer) adds stacks and evidence."""

    last_seq: Dict[str, Optional[int]]
    groups: Dict[str, Optional[List[int]]]
    ops_recorded: Optional[float]  # a count
    ddp_steps: Optional[int]
    site_counts: Dict[str, int]
    p2p_counts: Dict[str, int]  # "group:op:peer" -> sends to / receives from that peer so far (point-to-point)
    recorder: str  # where the records came from: "python" (a wrapper per collective) or "flight" (torch's FR)
    rank_condition: Optional[RankCondition]
    code: Dict[str, CodeAround]  # "file:line" -> what encloses it, for the lines this rank passed (full form)
    epochs: List[LoaderEpochs]  # each DataLoader's epochs (full form)
    iterators: List[IteratorSeen]  # the iterators the main thread's user frames hold, and whether each ran out
    stacks: List[Stack]  # main thread first
    process: Optional[ProcessFacts]
    progress_bars: List[ProgressBar]
    flight_recorder: Dict[str, Any]
    native: Dict[str, Any]  # py-spy's dump
    stale: Optional[bool]
    store_lost: Optional[bool]
    signal: Optional[str]  # an exited rank ended by this signal (SIGTERM, SIGINT, SIGHUP), its handler's or not
    source: Dict[str, Any]  # Flight Recorder input: the dump it came from
    fingerprints: FingerprintDoc  # the positions it completed (watch/fingerprints.py; an incident's answer)
    run: str  # the run it is of: "<stamp>-<token>" (watch/store.py: StateStore.run); absent in older files


class MismatchRow(TypedDict):
    """One distinct call in a mismatch, beside the others (analysis.passes._side_by_side; words: render/wording.py)."""

    ranks: List[int]
    group: str
    seq: Optional[int]
    op: Optional[str]
    api: Optional[str]
    shapes: List[List[int]]
    dtypes: List[str]
    site: Optional[Site]
    region: Optional[Region]
    wait_s: Optional[float]
    state: Optional[str]
    description: Optional[str]


class Evidence(TypedDict, total=False):
    """What a finding rests on; besides these, kind-specific keys (culprit_rule, ddp_op ...), kept as they are."""

    mismatched: List[MismatchRow]


class _FindingBase(TypedDict):
    kind: str  # one of analysis.FINDING_KINDS
    ranks: List[int]
    summary: str
    fix: str
    location: Optional[Site]
    evidence: Optional[Evidence]


class Basis(TypedDict, total=False):
    """What a finding rests on (analysis/table.py: KIND_STATUS, basis()): a fact observed in the run, or a reading."""

    status: str  # "fact", "explained" (a proven fact, its cause a reading) or "reading"
    fact: Optional[str]  # the fact's name (analysis/table.py: Stage.proves); None for a reading alone
    acts: bool  # whether a rank-ending action may act on it
    says: Optional[str]  # the fact, in words (render/basis_words.py)
    reading: Optional[str]  # what is inferred beside it, in words
    confirm: Optional[str]  # what would confirm the reading
    confirmed: bool  # the ranks it describes confirmed it in their own answers (analysis/confirm.py), or not
    unconfirmed: List[int]  # the ranks that did not: it rests on what the store held for them


class Finding(_FindingBase, total=False):
    """One verdict as report.json has it: analysis.passes.finding()'s data, worded by render/wording.py."""

    facts: Dict[str, Any]  # what the words were made of (render words them again); absent in older files
    basis: Basis  # absent in files written before it was kept (then nothing says it may be acted on)


class IncidentSource(TypedDict):
    """What an incident rebuilt offline was made from."""

    kind: str  # "rank_files", "flight_recorder"
    files: List[str]


class _IncidentBase(TypedDict):
    format_version: int
    run_id: Optional[str]
    world_size: int
    created_at: Optional[float]  # epoch seconds
    trigger: Optional[str]  # analysis.DEADLOCK, TIMEOUT, SILENT, DUMP
    written_by: Optional[int]
    grace: float
    timeout: float
    ranks: List[RankState]
    missing_ranks: List[int]
    findings: List[Finding]


class Incident(_IncidentBase, total=False):
    """One report (incident.build()): every rank's state, the findings, and where it came from."""

    silent: Dict[str, Dict[str, Any]]
    rank_conditions: Dict[str, RankCondition]  # str(rank) -> over its stack, read when the incident was taken
    source: Optional[IncidentSource]
    report_dir: Optional[str]
