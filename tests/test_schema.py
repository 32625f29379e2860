"""validate.py's checks of ddpwatch's own objects come from types.py: every field of every shape is checked, every
rule of validate.py names a field of a shape, and a field added to a shape is checked without touching validate.py.
No torch."""

from __future__ import annotations

import copy
import json
import os
import sys
import typing
from typing import Optional, Tuple, TypedDict

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import seed_states  # noqa: E402
from test_crafted_input import seed_incident  # noqa: E402
from test_flight_recorder import seed_dumps, write_dumps  # noqa: E402
from test_incident import dead_rank, live, seed_with_condition, straggler_states, stuck_states  # noqa: E402
from test_render import golden_seed_incident  # noqa: E402

from ddpwatch.format import types, validate  # noqa: E402
from ddpwatch.format.version import FormatError  # noqa: E402
from ddpwatch.render.json_report import render_json  # noqa: E402
from ddpwatch.sources import flight_recorder as fr  # noqa: E402


def all_shapes() -> dict:
    return {
        name: value
        for name, value in vars(types).items()
        if typing.is_typeddict(value) and value.__module__ == types.__name__
    }


def public_shapes() -> dict:
    return {name: shape for name, shape in all_shapes().items() if not name.startswith("_")}


def _has_any(hint) -> bool:
    return hint is typing.Any or any(_has_any(arg) for arg in typing.get_args(hint))


def refusal(check, doc, *args):
    try:
        check(doc, "", *args)
    except FormatError as exc:
        return str(exc)
    return None


@pytest.fixture
def derived_again():
    """Checks derived from the shapes as a test changed them, and from the real ones afterwards."""
    validate.clear_cache()
    yield
    validate.clear_cache()


# ---------------------------------------------------------------- one definition


def test_every_field_of_every_shape_is_checked():
    """A value of no JSON type is refused by the check of every typed field; only fields typed with Any (kept,
    not interpreted) take it, and those are still limited in depth and string size."""
    for name, shape in public_shapes().items():
        hints = typing.get_type_hints(shape)
        checks = validate.field_checks(shape)
        assert set(checks) == set(hints), name
        for key, check in checks.items():
            untyped = _has_any(hints[key])
            assert (refusal(check, object()) is None) == untyped, f"{name}.{key}: {hints[key]}"
            if untyped:
                assert refusal(check, [[[]]] * 2 + ["x" * (validate.MAX_STRING + 1)]) is not None


def test_every_rule_of_schema_names_a_field_of_a_shape():
    shapes_by_name = public_shapes()
    fields_of = {name: set(typing.get_type_hints(shape)) for name, shape in shapes_by_name.items()}
    for shape, key in validate.LIMITS:
        assert key in fields_of.get(shape, ()), (shape, key)
    for table in (validate.REQUIRED, validate.FIRST):
        for shape, keys in table.items():
            assert set(keys) <= fields_of.get(shape, set()), (shape, keys)
            # a reader never insists on a key some writer leaves out
            assert set(keys) <= shapes_by_name[shape].__required_keys__, (shape, keys)
    assert set(validate.ACROSS) <= set(shapes_by_name)


def test_a_field_added_to_a_shape_is_checked_without_touching_schema(monkeypatch, derived_again):
    class Site(types.Site, total=False):
        column: int

    class RankState(types.RankState, total=False):
        gpu_util: Optional[float]

    monkeypatch.setattr(types, "Site", Site)
    monkeypatch.setattr(types, "RankState", RankState)
    validate.clear_cache()
    doc = seed_incident()
    assert refusal(validate.incident, doc) is None  # an optional field: files written before it still load
    doc["ranks"][1]["inflight"][0]["site"]["column"] = 7
    doc["ranks"][0]["gpu_util"] = 93.5
    assert refusal(validate.incident, doc) is None
    doc["ranks"][1]["inflight"][0]["site"]["column"] = "7"
    assert refusal(validate.incident, doc) == "ranks[1].inflight[0].site.column: expected an integer, got str"
    state = copy.deepcopy(seed_states(2)[0])
    state["gpu_util"] = [93.5]
    assert refusal(validate.rank_snapshot, state) == "gpu_util: expected a number, got list"
    state["gpu_util"] = None
    assert refusal(validate.rank_snapshot, state) is None


def test_without_the_added_field_the_same_document_passes(derived_again):
    """The counterpart of the test above: the real shapes keep an unknown field as it is."""
    doc = seed_incident()
    doc["ranks"][1]["inflight"][0]["site"]["column"] = "7"
    assert refusal(validate.incident, doc) is None


def test_a_type_schema_has_no_check_for_is_an_error_not_an_unchecked_field():
    class Odd(TypedDict):
        pair: Tuple[int, int]

    with pytest.raises(TypeError, match="Odd.pair"):
        validate.field_checks(Odd)


def test_a_bound_the_type_cannot_have_is_an_error(monkeypatch):
    monkeypatch.setitem(validate.LIMITS, ("Site", "file"), validate.Limit(low=0))
    with pytest.raises(TypeError, match="Site.file"):
        validate.field_checks(types.Site)


def test_the_world_size_bounds_every_rank_in_the_document():
    doc = seed_incident()
    doc["missing_ranks"] = [2]
    assert refusal(validate.incident, doc) == "missing_ranks[0]: 2 is outside 0..1"
    state = seed_states(4)[3]
    assert refusal(validate.rank_snapshot, state, 2) == "rank: 3 is outside 0..1"
    assert refusal(validate.rank_snapshot, state) is None


# ---------------------------------------------------------------- what ddpwatch writes still passes


def written_documents() -> dict:
    docs = {"factory": seed_incident(), "golden": golden_seed_incident()}
    docs["seed"] = live(seed_with_condition(), 2)
    docs["straggler"] = live(straggler_states(), 2)
    docs["stuck"] = live(stuck_states(), 2)
    st, silent = dead_rank()
    docs["dead"] = live(st, 2, silent=silent)
    return docs


@pytest.mark.parametrize("name", ["factory", "golden", "seed", "straggler", "stuck", "dead"])
def test_incidents_ddpwatch_builds_pass(name):
    doc = json.loads(json.dumps(written_documents()[name]))
    assert refusal(validate.incident, doc) is None
    for state in doc["ranks"]:
        assert refusal(validate.rank_snapshot, state) is None


def test_an_incident_read_from_flight_recorder_dumps_passes(tmp_path):
    doc = json.loads(render_json(fr.load_incident([str(write_dumps(tmp_path / "fr", seed_dumps()))])))  # as written
    assert refusal(validate.incident, doc) is None


def test_a_refusal_names_the_field_by_its_path_spelled_only_when_it_fails():
    """Checks pass paths down unspelled (validate.where_text spells one only when a check fails): every form a path
    takes reads as it did when each was spelled on the way down."""
    state = copy.deepcopy(seed_states(2)[0])
    state["groups"] = {"g": [0, "1"]}
    assert refusal(validate.rank_snapshot, state) == 'groups["g"][1]: expected an integer, got str'
    state["groups"] = {"x" * (validate.MAX_STRING + 1): None}
    assert refusal(validate.rank_snapshot, state) == (
        f"groups key: a string of {validate.MAX_STRING + 1} characters (at most {validate.MAX_STRING})"
    )
    state["groups"] = {}
    state["stacks"][0]["frames"][0]["line"] = 1.5
    assert refusal(validate.rank_snapshot, state) == "stacks[0].frames[0].line: expected an integer, got float"
    state["stacks"][0]["frames"][0]["line"] = 1
    state["an_unknown_field_whose_name_runs_past_forty_characters"] = float("nan")
    assert refusal(validate.rank_snapshot, state) == "an_unknown_field_whose_name_runs_past_fo: nan is not a number"
    assert validate.where_text("") == "" and validate.where_text(("", ".", "rank")) == "rank"


def test_a_field_passed_at_a_glance_is_one_its_check_would_pass():
    """fields() skips the call for a plain str, int, float or bool (and a null where the field may be null): for every
    value, the object's check refuses exactly what the field's own check refuses, and says the same."""
    import enum

    class Small(enum.IntEnum):
        one = 1

    class Text(str):
        pass

    values = [None, True, False, 0, -1, 1.0, -0.0, float("nan"), float("inf"), -float("inf"), validate.MAX_NUMBER]
    values += [validate.MAX_NUMBER * 2.0, validate.MAX_INT, validate.MAX_INT + 1, -validate.MAX_INT - 1]
    values += [Small.one, "", "x" * validate.MAX_STRING, "x" * (validate.MAX_STRING + 1), Text("x"), [], {}, b"x"]
    checks = [validate.text, validate.integer, validate.boolean, validate.number, validate.ranged(0, 3)]
    checks += [validate.nullable(check) for check in checks]
    for check in checks:
        alone = validate.fields({"f": check})
        for value in values:
            own = refusal(check, value)
            assert refusal(alone, {"f": value}) == (None if own is None else f"f: {own}"), (check, value)
