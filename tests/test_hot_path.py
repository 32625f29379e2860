"""The per-collective wrapper: generated with each collective's own signature, arguments passed on untouched."""

import inspect
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import ddpwatch
from ddpwatch import catalogue
from ddpwatch.capture import record, sites
from ddpwatch.capture.signatures import signature_source
from ddpwatch.capture.replacements import PATCH_MARKER


def _kinds_of_parameters():
    def every_kind(a, b=1, /, c=2, *args, d, e=3, **kw):
        return (a, b, c, args, d, e, kw)

    def positional_only_then_keyword_only(a, /, *, k=1):
        return (a, k)

    def plain(x, y=None):
        return (x, y)

    def only_positional(a, b, /):
        return (a, b)

    def only_keyword(*, k):
        return k

    return [
        (every_kind, [((1,), {"d": 4}), ((1, 2, 3, 9, 9), {"d": 4, "z": 1})]),
        (positional_only_then_keyword_only, [((1,), {}), ((1,), {"k": 5})]),
        (plain, [((1,), {}), ((), {"x": 1, "y": 2})]),
        (only_positional, [((1, 2), {})]),
        (only_keyword, [((), {"k": 3})]),
    ]


@pytest.mark.parametrize("original, calls", _kinds_of_parameters(), ids=lambda v: getattr(v, "__name__", ""))
def test_generated_signature_equals_the_original_and_passes_every_argument_on(original, calls):
    params, call, defaults = signature_source(inspect.signature(original))
    namespace = {**defaults, "_original": original}
    exec(f"def generated({params}):\n    return _original({call})", namespace)
    generated = namespace["generated"]
    assert inspect.signature(generated) == inspect.signature(original)
    for args, kwargs in calls:
        assert generated(*args, **kwargs) == original(*args, **kwargs)


def test_defaults_are_the_very_same_objects_not_their_repr():
    sentinel = object()

    def original(tensor, op=sentinel):
        return op

    params, call, defaults = signature_source(inspect.signature(original))
    namespace = {**defaults, "_original": original}
    exec(f"def generated({params}):\n    return _original({call})", namespace)
    assert namespace["generated"](1) is sentinel


def test_every_patched_collective_keeps_its_signature_and_records_keyword_calls(one_rank_group):
    with ddpwatch.guard() as session:
        one_rank_group()
        for name in catalogue.tensor_collectives():
            wrapper = getattr(c10d, name, None)
            if wrapper is None:
                continue
            original = getattr(wrapper, PATCH_MARKER)
            code = wrapper.__code__
            own = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            assert list(own) == [
                p
                for p in inspect.signature(original).parameters
                if inspect.signature(original).parameters[p].kind
                not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            ], name
        group = dist.new_group([0])
        dist.all_reduce(tensor=torch.ones(2), op=dist.ReduceOp.MAX, group=group)
        dist.broadcast(torch.ones(3, 1), 0, group, False)
        work = dist.all_reduce(torch.ones(1), async_op=True)
        work.wait()
        session.recorder.poll_pending()
        done = [(r["op"], r["group"] != "0", r["shapes"]) for r in session.recorder.snapshot(recent=10)["recent"]]
    assert done[-3:] == [("all_reduce", True, [[2]]), ("broadcast", True, [[3, 1]]), ("all_reduce", False, [[1]])]


def test_a_user_error_through_the_wrapper_shows_readable_lines_and_is_the_same_exception(one_rank_group):
    with ddpwatch.guard():
        one_rank_group()
        with pytest.raises(Exception) as caught:
            dist.all_reduce("not a tensor")
    frames = traceback.extract_tb(caught.value.__traceback__)
    ours = [f for f in frames if f.filename.startswith("<ddpwatch hot path")]
    assert ours and all(f.line for f in ours)  # the generated source is in linecache
    assert sites.file_kind(ours[0].filename) == sites.INTERNAL  # never taken for the user's line


def test_the_site_is_the_line_of_a_call_spread_over_several_lines():
    recorder = record.Recorder()

    def issue():
        return recorder.begin(
            "all_reduce",
            "all_reduce",
            "0",
            (),
            __import__("sys")._getframe(),
        )

    first_line = inspect.getsourcelines(issue)[1]
    done = issue().to_dict(0.0)
    assert done["site"]["function"] == "issue"
    assert done["site"]["line"] in range(first_line + 1, first_line + 5)
    assert recorder.snapshot()["site_counts"] == {f"{__file__}:{done['site']['line']}": 1}


def test_the_line_read_back_from_the_instruction_offset_is_what_f_lineno_says():
    import sys

    seen = []

    def probe():
        frame = sys._getframe(1)
        seen.append((sites._line_at(frame.f_code, frame.f_lasti), frame.f_lineno))

    def body():
        for i in range(3):
            if i == 1:
                probe()
            [probe() for _ in range(1)]
            probe()
            try:
                probe()
                raise ValueError
            except ValueError:
                probe()
        return probe()

    body()
    assert len(seen) == 14 and all(ours == python for ours, python in seen)


def _patcher_around(original):
    """A real Patcher's wrapper for `original`, with a stand-in c10d world holding one group of this rank."""
    import types
    import weakref

    from ddpwatch.capture.wrappers import Patcher

    class Group:
        pass

    group, recorder = Group(), record.Recorder()
    patcher = Patcher(recorder)
    patcher._c10d = types.SimpleNamespace(_world=types.SimpleNamespace(_default_pg=group, pg_coalesce_state={}))
    patcher._group_cache[id(group)] = (weakref.ref(group), "0", True)
    recorder.note_group("0", None, True)
    return patcher._collective_wrapper(original, "all_reduce", "all_reduce", ("tensor",)), recorder


def test_parameters_named_like_the_wrappers_own_names_do_not_shadow_them():
    def all_reduce(tensor, op=None, id=None, sys=None, exc=None, group=None, async_op=False):
        if exc:
            raise ValueError(exc)
        return (tensor, op, id, sys)

    wrapper, recorder = _patcher_around(all_reduce)
    tensor = torch.ones(2)
    result = wrapper(tensor, "max", id=7, sys="s")
    assert result[0] is tensor and result[1:] == ("max", 7, "s")
    with pytest.raises(ValueError, match="boom"):
        wrapper(torch.ones(1), exc="boom")
    states = [r.state for r in recorder.ring]
    assert states == ["completed", "failed"] and recorder.busy == set()


def test_a_collective_with_a_parameter_in_the_wrappers_namespace_is_refused():
    def all_reduce(tensor, _w_pg=None):
        return tensor

    with pytest.raises(ValueError, match="_w_"):
        _patcher_around(all_reduce)


def test_a_warning_raised_inside_a_wrapped_collective_names_the_users_line(one_rank_group):
    """Issue 27: torch's monitored_barrier warns with stacklevel=2 about a float timeout; the warning named
    `<ddpwatch hot path: monitored_barrier>:32` instead of this file's line."""
    import warnings

    with ddpwatch.guard():
        one_rank_group()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = sys._getframe().f_lineno + 1
            dist.monitored_barrier(timeout=5.0)
    [warning] = [w for w in caught if "timedelta" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, line)
