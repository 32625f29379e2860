"""Crafted input to `ddpwatch report` and its loaders: one line on stderr and exit 2, never a traceback, a
MemoryError or minutes of work. The issue's cases, then a fuzz test over the loaders (hypothesis). No torch.

Cases that could allocate gigabytes before the fix run `ddpwatch report` in a subprocess under an address-space
limit, so a regression fails the test instead of the machine.
"""

import copy
import json
import os
import pickle
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

sys.path.insert(0, os.path.dirname(__file__))

from factory import done, incident, seed_states  # noqa: E402
from test_flight_recorder import NOW_NS, seed_dumps, write_dumps  # noqa: E402

from ddpwatch import analysis
from ddpwatch.format import documents, validate
from ddpwatch.format.version import FormatError
from ddpwatch.sources import flight_recorder as fr, merge, report_command
from ddpwatch.render import report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORY_LIMIT = 3 * 2**30


def _limit_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def report_cli(*argv, timeout=120):
    """`ddpwatch report ARGV` in a subprocess with at most 3 GiB of address space."""
    return subprocess.run(
        [sys.executable, "-m", "ddpwatch", "report", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        preexec_fn=_limit_memory,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )


def assert_one_line_error(done_run, *expected):
    assert done_run.returncode == 2, (done_run.returncode, done_run.stderr[-3000:])
    err = done_run.stderr
    assert err.startswith("ddpwatch report: ") and err.count("\n") == 1, err[-3000:]
    assert "Traceback" not in err and "MemoryError" not in err
    for text in expected:
        assert text in err, err


def seed_incident():
    st_ = seed_states(2)
    for state in st_.values():
        state["recent"] = [done(9, "all_reduce", age=30.0)]
    return incident(st_, analysis.assess(st_, 2, 2.0, 300.0).findings)


def write_json(path, doc, text=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else json.dumps(doc))
    return path


# ---------------------------------------------------------------- report.json and rank files


def broken_incidents():
    def finding_without_ranks(doc):
        del doc["findings"][0]["ranks"]

    def junk_stacks(doc):
        doc["ranks"][0]["stacks"] = "junk"

    def junk_frames(doc):
        doc["ranks"][1]["stacks"] = [{"main": True, "frames": [1, "x", None]}]

    def junk_inflight(doc):
        doc["ranks"][0]["inflight"] = [1, "x"]

    def record_without_op(doc):
        del doc["ranks"][1]["inflight"][0]["op"]

    def string_rank(doc):
        doc["ranks"][0]["rank"] = '0"><script>alert(1)</script>'

    def rank_outside_the_world(doc):
        doc["findings"][0]["ranks"] = [7]

    def huge_time(doc):
        doc["created_at"] = 1e300

    def huge_world(doc):
        doc["world_size"] = 10**9

    def row_junk(doc):
        doc["findings"][0]["evidence"]["mismatched"] = [{"ranks": "0"}]

    return [
        finding_without_ranks,
        junk_stacks,
        junk_frames,
        junk_inflight,
        record_without_op,
        string_rank,
        rank_outside_the_world,
        huge_time,
        huge_world,
        row_junk,
    ]


@pytest.mark.real
@pytest.mark.parametrize("damage", broken_incidents(), ids=lambda f: f.__name__)
def test_a_damaged_report_json_is_one_line_and_exit_2(tmp_path, damage):
    doc = seed_incident()
    damage(doc)
    path = write_json(tmp_path / "inc" / "report.json", doc)
    for fmt in ("text", "html"):
        assert_one_line_error(report_cli(path, "--format", fmt), str(path))


@pytest.mark.real
def test_a_summary_naming_a_hundred_billion_ranks_still_renders(tmp_path):
    doc = seed_incident()
    del doc["findings"][0]["facts"]  # as a report.json written before facts were kept: its summary shown as stored
    doc["findings"][0]["summary"] = "Ranks 0-99999999999,1,2,3,4,5,6,7,8,9,10,11,12 wait."  # prose is not checked
    path = write_json(tmp_path / "report.json", doc)
    done_run = report_cli(path)
    assert done_run.returncode == 0, done_run.stderr[-3000:]
    assert "Ranks 0-99999999999,1,2,3,4,5,6,7,8,9,10,11,12 wait." in done_run.stdout


@pytest.mark.real
@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_is_refused(tmp_path, token):
    text = json.dumps(seed_incident()).replace('"created_at": 1700000200.0', f'"created_at": {token}')
    assert token in text
    path = write_json(tmp_path / "report.json", None, text)
    assert_one_line_error(report_cli(path), f"{token} is not a JSON number")


@pytest.mark.real
def test_deeply_nested_json_is_an_error_not_a_recursion_error(tmp_path):
    depth = 200_000
    text = '{"format_version": 1, "ranks": [], "findings": [], "x": ' + "[" * depth + "]" * depth + "}"
    path = write_json(tmp_path / "report.json", None, text)
    assert_one_line_error(report_cli(path), "nested too deeply")
    inner = json.dumps(seed_incident())[:-1] + ', "extra": ' + "[" * 500 + "]" * 500 + "}"  # parses, too deep
    path = write_json(tmp_path / "b" / "report.json", None, inner)
    assert_one_line_error(report_cli(path), "nested more than")


@pytest.mark.real
def test_rank_files_claiming_a_billion_ranks_are_refused(tmp_path):
    for state in seed_states(2).values():
        state["world_size"] = 10**9
        write_json(tmp_path / "ranks" / f"rank-{state['rank']}.json", state)
    assert_one_line_error(report_cli(tmp_path / "ranks", "--format", "html"), "world_size", "outside")


@pytest.mark.real
def test_a_very_large_report_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "report.json"
    with open(path, "wb") as handle:  # sparse: no disk used; only its size matters
        handle.truncate(validate.MAX_DOCUMENT_BYTES + 1)
    assert_one_line_error(report_cli(path), "larger than")


@pytest.mark.real
def test_a_74_mb_report_of_two_ranks_is_refused_quickly(tmp_path):
    """The issue's 74 MB input: two ranks with about 110,000 records each (HTML took minutes)."""
    doc = seed_incident()
    template = doc["ranks"][0]["recent"][0]
    for state in doc["ranks"]:
        state["recent"] = [dict(template, seq=seq) for seq in range(110_000)]
    path = write_json(tmp_path / "report.json", doc)
    assert path.stat().st_size > 70e6
    assert_one_line_error(report_cli(path, "--format", "html"), f"at most {validate.MAX_RECORDS}")


@pytest.mark.real
def test_the_largest_accepted_rank_still_renders_as_html(tmp_path):
    """At the record limit the page is still made in one pass (the lookup per box used to be linear)."""
    doc = seed_incident()
    template = doc["ranks"][0]["recent"][0]
    doc["ranks"][0]["recent"] = [
        dict(template, seq=seq, start=1_700_000_000.0 + seq) for seq in range(validate.MAX_RECORDS - 5)
    ]
    path = write_json(tmp_path / "report.json", doc)
    done_run = report_cli(path, "--format", "html", "-o", tmp_path / "out.html", timeout=240)
    assert done_run.returncode == 0, done_run.stderr[-3000:]


@pytest.mark.real
@pytest.mark.parametrize("option", ["--grace", "--timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_non_finite_or_negative_analysis_settings_are_refused(tmp_path, option, value):
    path = write_json(tmp_path / "inc" / "report.json", seed_incident())
    assert_one_line_error(report_cli(path, "--reanalyze", f"{option}={value}"), option)


def test_what_ddpwatch_writes_passes_the_schema(tmp_path):
    doc = seed_incident()
    folder, _ = documents.save_incident(str(tmp_path), "r1", doc, report.renderings)
    assert documents.load_incident(folder)["findings"] == doc["findings"]
    for rank in (0, 1):
        documents.load_document(os.path.join(folder, f"rank-{rank}.json"))


# ---------------------------------------------------------------- Flight Recorder dumps


class Reduce:
    """Pickles as a call of `func(*args)`: how a crafted dump makes the unpickler call an allowed builtin."""

    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def fr_folder(tmp_path, data, rank=0):
    folder = tmp_path / "fr"
    folder.mkdir(exist_ok=True)
    (folder / f"fr_trace_{rank}").write_bytes(data)
    return folder


@pytest.mark.real
def test_a_pickle_allocating_8_gb_through_bytes_is_refused(tmp_path):
    data = pickle.dumps({"entries": [], "x": Reduce(bytes, (8 * 10**9,))}, protocol=2)
    assert_one_line_error(report_cli("--flight-recorder", fr_folder(tmp_path, data)), "refused")


@pytest.mark.real
def test_a_pickle_with_a_huge_memo_index_allocates_nothing(tmp_path):
    data = b"\x80\x04}r" + struct.pack("<I", 2**31) + b"."  # LONG_BINPUT 2**31: the C unpickler sizes its memo
    folder = fr_folder(tmp_path, data)
    assert_one_line_error(report_cli("--flight-recorder", folder), str(folder))  # an empty dict: no dump there


@pytest.mark.real
def test_a_pickle_sharing_one_entry_a_million_times_is_refused(tmp_path):
    frames = [{"name": "f", "filename": "/u/train.py", "line": 1}] * 100_000
    entry = dict(seed_dumps()[1]["entries"][-1], frames=frames)
    data = pickle.dumps({"version": "2.10", "entries": [entry] * 1_000_000}, protocol=4)  # memo: about 4 MB
    assert len(data) < 10e6
    assert_one_line_error(report_cli("--flight-recorder", fr_folder(tmp_path, data)), "fr_trace_0")


@pytest.mark.real
@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x02c__builtin__\nbytes\nJ\x00\x00\x00\x7f\x85R.",  # bytes(2130706432)
        b"\x80\x02c__builtin__\nstr\nJ\x00\x00\x00\x7f\x85R.",  # not an allocation, still not data
        b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f}.",  # a frame claiming 2**63 bytes
        b"\x80\x04\x8c\x04evil\x8c\x04name\x93.",  # STACK_GLOBAL of a foreign name
        b"\x80\x02]q\xffh\xff\x85.",  # memo use: plain, but not a dump
        b"\x80\x04\x8c\x01a\x94\x8c\x01b\x94h\x00\x81.",  # NEWOBJ on a string
    ],
    ids=["bytes", "str", "frame", "stack_global", "memo", "newobj"],
)
def test_crafted_pickle_opcodes_end_in_one_line(tmp_path, data):
    folder = fr_folder(tmp_path, data)
    assert_one_line_error(report_cli("--flight-recorder", folder), str(folder))


@pytest.mark.parametrize("kind", ["pickle", "json"])
def test_the_spellings_torch_writes_pass_the_checks(tmp_path, kind):
    """As torch 2.13 writes them: counters as text in JSON dumps, tuples in pickles, extra sections."""
    dumps = seed_dumps()
    for dump in dumps.values():
        dump["nccl_comm_state"] = {}
        dump["pg_status"]["0"] = {k: str(v) for k, v in dump["pg_status"]["0"].items()}
        for entry in dump["entries"]:
            entry.update(
                process_group=tuple(entry["process_group"]),
                thread_id="139766887193472",
                time_discovered_completed_ns=0,
                output_sizes=[[4]],
            )
    incident_doc = fr.load_incident([str(write_dumps(tmp_path / "fr", dumps, kind))])
    assert [f["ranks"] for f in incident_doc["findings"]] == [[0]]


@pytest.mark.real
def test_mixed_record_id_types_are_one_line(tmp_path):
    dumps = seed_dumps()
    dumps[0]["entries"][0]["record_id"] = "first"
    folder = write_dumps(tmp_path / "fr", dumps)
    assert_one_line_error(report_cli("--flight-recorder", folder), "record_id")


@pytest.mark.real
def test_a_group_of_a_billion_ranks_is_refused(tmp_path):
    dumps = seed_dumps()
    dumps[0]["pg_config"][""]["ranks"] = json.dumps([0, 10**9])
    assert_one_line_error(report_cli("--flight-recorder", write_dumps(tmp_path / "fr", dumps)), "ranks")


@pytest.mark.real
def test_a_rank_number_of_a_billion_in_a_file_name_is_refused(tmp_path):
    dumps = seed_dumps()
    folder = write_dumps(tmp_path / "fr", {0: dumps[0], 10**9: dumps[1]})
    assert_one_line_error(report_cli("--flight-recorder", folder), "rank")


@pytest.mark.real
def test_a_nan_in_a_json_dump_is_refused(tmp_path):
    folder = write_dumps(tmp_path / "fr", seed_dumps(), "json")
    path = folder / "fr_trace_0"
    path.write_text(path.read_text().replace('"time_created_ns": ', '"time_created_ns": NaN, "x": ', 1))
    assert_one_line_error(report_cli("--flight-recorder", folder), "NaN")


def _far_ahead_dumps(seq):
    """The seed dumps with rank 0's first collective (a barrier it completed) at position `seq` instead of 1, as
    the fuzz test below found it (seed 130): the positions of that group run from 2 to `seq`."""
    dumps = seed_dumps()
    dumps[0]["entries"][0]["collective_seq_id"] = seq
    return dumps


def test_a_sequence_number_far_ahead_makes_no_slot_per_position_between(tmp_path):
    """The completed positions' fingerprints (analysis/silent.py) kept one slot per position from the oldest to the
    newest: 10**7 slots here, 2**62 for a crafted dump (gigabytes, then minutes of rendering). At most two per
    position completed, the newest."""
    incident_doc = fr.load_incident([str(write_dumps(tmp_path / "fr", _far_ahead_dumps(10**7)))])
    fingerprints = incident_doc["ranks"][0]["fingerprints"]["groups"]["0"]
    assert fingerprints["first"] == 10**7 and len(fingerprints["ids"]) == 1  # 2 is more than two slots behind
    render_everything(incident_doc)


@pytest.mark.real
def test_the_largest_sequence_number_renders_within_3_gb(tmp_path):
    folder = write_dumps(tmp_path / "fr", _far_ahead_dumps(validate.MAX_INT - 1))
    done_run = report_cli("--flight-recorder", folder, "--format", "json")
    assert done_run.returncode == 0 and not done_run.stderr, done_run.stderr[-3000:]
    assert json.loads(done_run.stdout)["ranks"][0]["fingerprints"]["groups"]["0"]["first"] == validate.MAX_INT - 1


# ---------------------------------------------------------------- fuzz: mutated documents through every loader

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            '0"><script>x</script>',
            "",
            "-1",
            "nan",
            "0-1000000000",
            "\x1b[2J\u202e\x00",
            "x" * 300_000,
            "ranks 0-99999999999,1,2,3,4,5,6,7,8,9,10,11,12",
        ]
    ),
    st.lists(st.integers(min_value=-3, max_value=10**12), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.just([[[[]]]]),
    st.just({"": None}),
)


def _paths(value, prefix=()):
    """Every (path, value) inside a document, the document itself included."""
    yield prefix, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, prefix + (index,))


def mutate(data, doc):
    """Up to 4 random changes: a value replaced by junk, a key removed, or a list item duplicated."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        paths = [path for path, _ in _paths(doc) if path]
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        action = data.draw(st.sampled_from(["replace", "replace", "delete", "duplicate"]))
        if action == "replace":
            parent[path[-1]] = copy.deepcopy(data.draw(JUNK))  # st.just gives one shared object
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))
    return doc


def render_everything(incident_doc):
    for fmt in report.FORMATS:
        report.render_format(incident_doc, fmt)


def loads_or_format_error(load):
    """The loader's contract: a result that every renderer renders, or a FormatError (what the CLI turns into
    one line and exit 2). Anything else fails the test, with the example hypothesis found."""
    try:
        result = load()
    except FormatError:
        return
    render_everything(result)


# Examples per loader from the Hypothesis profile (tests/conftest.py): 100 by default (about a second each here),
# `--hypothesis-profile=long` (5000) for a longer hunt by hand.
FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))

HANGING_FUZZ_TEST = """
from hypothesis import given, settings, strategies as st

@settings(deadline=None, database=None)
@given(st.integers())
def test_hangs(n):
    while True:
        pass
"""


@pytest.mark.real
def test_a_hanging_fuzz_test_stops_at_its_time_limit(tmp_path):
    """pytest-timeout's default method raises pytest's Failed in the test, which Hypothesis takes for a failing
    example: it runs the example again, with no alarm left, forever. conftest.py gives Hypothesis tests the thread
    method: a stack dump, then the process ends."""
    (tmp_path / "test_hangs.py").write_text(HANGING_FUZZ_TEST)
    done_run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "--timeout=2", "test_hangs.py"],
        capture_output=True,
        text=True,
        timeout=60,  # a hang: TimeoutExpired fails this test
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])),
    )
    assert done_run.returncode != 0 and "Timeout" in done_run.stdout + done_run.stderr, done_run.stdout[-3000:]


@FUZZ
@given(st.data())
def test_fuzz_report_json(tmp_path_factory, data):
    path = write_json(
        tmp_path_factory.mktemp("inc") / "report.json", None, json.dumps(mutate(data, seed_incident()), allow_nan=True)
    )
    loads_or_format_error(lambda: report_command.build_incident(_Args([str(path)], reanalyze=data.draw(st.booleans()))))


@FUZZ
@given(st.data())
def test_fuzz_rank_files(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("ranks")
    for state in seed_states(2).values():
        state = mutate(data, state) if data.draw(st.booleans()) else state
        write_json(
            folder
            / f"rank-{state.get('rank') if isinstance(state.get('rank'), int) else 0}-x"
            / f"rank-{state['rank'] if isinstance(state.get('rank'), int) else 1}.json",
            None,
            json.dumps(state, allow_nan=True),
        )
    loads_or_format_error(lambda: merge.merged_incident([str(folder)]))


@FUZZ
@given(st.data())
def test_fuzz_flight_recorder_dumps(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("fr")
    kind = data.draw(st.sampled_from(["pickle", "json"]))
    dumps = {rank: mutate(data, dump) if data.draw(st.booleans()) else dump for rank, dump in seed_dumps().items()}
    for rank, dump in dumps.items():
        path = folder / f"fr_trace_{rank}"
        try:
            path.write_bytes(
                pickle.dumps(dump, protocol=data.draw(st.integers(2, 5)))
                if kind == "pickle"
                else json.dumps(dump, allow_nan=True).encode()
            )
        except (TypeError, ValueError):
            return  # junk JSON cannot hold (a dict with non-string keys in a JSON dump)
        os.utime(path, (NOW_NS / 1e9, NOW_NS / 1e9))
    loads_or_format_error(lambda: fr.load_incident([str(folder)]))


@FUZZ
@given(st.binary(max_size=300), st.sampled_from([b"", b"\x80\x02", b"\x80\x04", b"\x80\x05", b"{"]))
def test_fuzz_raw_bytes(tmp_path_factory, raw, start):
    folder = tmp_path_factory.mktemp("raw")
    (folder / "fr_trace_0").write_bytes(start + raw)
    (folder / "report.json").write_bytes(start + raw)
    loads_or_format_error(lambda: fr.load_incident([str(folder)]))
    loads_or_format_error(lambda: documents.load_incident(str(folder)))


class _Args:
    def __init__(self, path, reanalyze=False):
        self.path, self.reanalyze = path, reanalyze
        self.flight_recorder, self.grace, self.timeout, self.format = None, None, None, "text"


def test_the_fuzz_documents_start_valid(tmp_path):
    """Without mutation every loader succeeds: the fuzz tests above start from real documents."""
    path = write_json(tmp_path / "inc" / "report.json", seed_incident())
    render_everything(report_command.build_incident(_Args([str(path)])))
    render_everything(fr.load_incident([str(write_dumps(tmp_path / "fr", seed_dumps()))]))
