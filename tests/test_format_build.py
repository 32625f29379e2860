"""The format's builders write exactly what format/types.py says a record and a rank state always hold. No torch."""

from __future__ import annotations

import typing

from ddpwatch.format import build, types
from ddpwatch.format.version import FORMAT_VERSION


def always_written(shape) -> list:
    """The keys of a shape's first (always-written) half, in the order types.py declares them."""
    return [key for key in typing.get_type_hints(shape) if key in shape.__required_keys__]


def assert_written_as_typed(doc: dict, shape) -> None:
    """Every always-written key of the shape, in its order; any other key a field of the shape's optional half
    (a rank state's last_seq, groups and ops_recorded are always written now, optional for older files)."""
    assert [key for key in doc if key in shape.__required_keys__] == always_written(shape)
    assert set(doc) - set(typing.get_type_hints(shape)) == set()


def a_record(**more) -> dict:
    return build.record(
        3,
        "0",
        "all_reduce",
        api=None,
        p2p=False,
        peer=None,
        shapes=[[2]],
        dtypes=["float32"],
        site=build.site("/u/train.py", 7, "step"),
        region=None,
        start=1.0,
        age_s=0.5,
        duration_s=None,
        state=build.IN_FLIGHT,
        error=None,
        thread="MainThread",
        **more,
    )


def a_rank_state(**more) -> dict:
    return build.rank_state(
        1,
        2,
        pid=None,
        host=None,
        beat=0,
        published_at=2.0,
        status=build.RUNNING,
        progress=4,
        idle_s=0.0,
        inflight=[a_record()],
        recent=[],
        last_seq={"0": 3},
        groups={"0": None},
        ops_recorded=4,
        **more,
    )


def test_a_record_holds_every_always_written_key_in_the_order_of_its_type():
    assert list(a_record()) == always_written(types.RecordDoc)
    assert_written_as_typed(a_record(via=None, fr={}), types.RecordDoc)


def test_a_rank_state_holds_every_always_written_key_in_the_order_of_its_type():
    state = a_rank_state()
    assert_written_as_typed(state, types.RankState)
    assert list(state)[: len(always_written(types.RankState))] == always_written(types.RankState)
    assert state["format_version"] == FORMAT_VERSION


def test_via_is_written_in_its_place_only_when_given():
    """Live records always carry `via` (null when no framework was called); Flight Recorder records never do."""
    keys = list(a_record(via=None))
    assert keys[keys.index("site") + 1] == "via"
    assert "via" not in a_record()


def test_optional_keys_follow_the_always_written_ones_in_the_order_given():
    assert list(a_record(fr={}, flight_recorder={}))[-2:] == ["fr", "flight_recorder"]
    assert list(a_rank_state(stacks=[], source={}))[-2:] == ["stacks", "source"]
