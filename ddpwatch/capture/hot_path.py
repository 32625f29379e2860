"""The per-collective wrapper's source: a template the Patcher compiles once per collective (capture/wrappers.py)."""

from __future__ import annotations

# The per-collective wrapper. A template, compiled once per collective with that collective's own parameter list:
# packing every call into *args/**kwargs and digging the group, tensor and async_op back out cost about a tenth
# of the guard's time per op. {params}/{call} are the original's parameters and the call passing them on; every
# other name, builtins included, is prefixed _w_ so that no parameter of a collective (all_reduce has `op`) can
# shadow it (_collective_wrapper refuses a collective with a parameter named _w_...).
HOT_PATH = """
def {name}({params}):
    _w_ident = _w_get_ident()
    if _w_ident in _w_busy:
        return _w_original({call})  # called by another patched collective: the outer one records
    _w_mark_busy(_w_ident)
    try:
        try:
            _w_pg = {group}
            if _w_pg is None:
                _w_pg = _w_world._default_pg if _w_direct_default else _w_world.default_pg
            _w_entry = _w_cache.get(_w_id(_w_pg))
            if _w_entry is None or _w_entry[0]() is not _w_pg:
                _w_name = _w_group_name(_w_pg)  # first call on this group: describe it and cache that
                _w_entry = _w_cache.get(_w_id(_w_pg)) or (None, _w_name, False)
            if not _w_entry[1] or (_w_coalescing and _w_pg in _w_coalescing):
                _w_record = None  # not a member; or queued inside _coalescing_manager: recorded once, issued
            else:
                _w_record = _w_begin(_w_op, _w_api, _w_entry[1], {metas}, _w_getframe(1), None, _w_ident)
        except Exception:
            _w_log_once("begin", "ddpwatch: could not record a collective; it runs unrecorded")
            _w_record = None  # never the user's problem
        if _w_record is None:
            return _w_original({call})
        {kept}_w_host = _w_entry[2]
        _w_async = {async_op}
        if _w_async or not _w_host:
            _w_hook_wait()  # once: from now on Work.wait() tells when such ops are done
        if not _w_host:
            _w_issuing[_w_ident] = _w_record  # a Work.wait() inside this call (c10d's own, for a sync call) is its
        try:
            _w_result = _w_original({call})
        except BaseException as _w_exc:
            _w_recorder.finish(_w_record, _w_exc)
            raise
        finally:
            if not _w_host:
                _w_issuing.pop(_w_ident, None)
        if _w_host and not _w_async:  # a host backend's synchronous call is done when it returns
            _w_finish_returned(_w_record)
        else:
            _w_recorder.issued(_w_record, _w_result if _w_async else None)
        return _w_result
    finally:
        _w_unmark_busy(_w_ident)
"""


# The parameters naming a rooted collective's root (global rank, or rank in the group): kept raw, a store per op.
ROOT_PARAMS = (("src", "group_src"), ("dst", "group_dst"))


def root_store(names: set) -> str:
    """The hot path's line keeping a rooted collective's root (broadcast, reduce, gather, scatter), else nothing."""
    for rank, group_rank in ROOT_PARAMS:
        if rank in names:
            spelled = group_rank if group_rank in names else "None"
            return f"_w_record.root = ({rank}, {spelled})\n        "
    return ""
