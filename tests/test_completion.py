"""When a recorded collective is done, per backend (issue 13: synchronous calls stay synchronous), on 1 gloo rank."""

import gc
import weakref

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import ddpwatch


def records(session):
    return session.recorder.snapshot(recent=100)


def test_a_synchronous_call_reaches_the_backend_synchronous_and_an_async_one_async(one_rank_group, monkeypatch):
    seen = []
    real = c10d.all_reduce

    def spy(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        seen.append(async_op)
        return real(tensor, op=op, group=group, async_op=async_op)

    monkeypatch.setattr(c10d, "all_reduce", spy)
    monkeypatch.setattr(dist, "all_reduce", spy)
    with ddpwatch.guard(interval=0.2) as session:
        one_rank_group()
        assert dist.all_reduce(torch.ones(2)) is None
        dist.all_reduce(torch.ones(2), async_op=True).wait()
        snap = records(session)
    assert seen == [False, True]  # ddpwatch used to turn every synchronous call into async_op=True + wait()
    assert snap["inflight"] == [] and [r["state"] for r in snap["recent"]] == ["completed", "completed"]


def test_gloo_reduce_scatter_is_done_when_wait_returns_though_its_work_never_says_so(one_rank_group):
    with ddpwatch.guard(interval=0.2) as session:
        one_rank_group()
        work = dist.reduce_scatter_single(torch.zeros(2), torch.ones(2), async_op=True)
        work.wait()
        assert not work.is_completed()  # gloo's quirk (torch 2.13): the reason not to trust is_completed() here
        dist.reduce_scatter_single(torch.zeros(2), torch.ones(2))  # synchronous: done when it returns
        for _ in range(50):  # FSDP2's pattern, many steps: nothing piles up in flight
            dist.reduce_scatter_single(torch.zeros(2), torch.ones(2), async_op=True).wait()
        session.recorder.poll_pending()
        snap = records(session)
    assert snap["inflight"] == []


def test_the_op_a_coalescing_manager_issues_is_recorded_once(one_rank_group):
    with ddpwatch.guard(interval=0.2) as session:
        one_rank_group()
        with c10d._coalescing_manager(async_ops=True) as manager:
            dist.all_reduce(torch.ones(2))
            dist.all_reduce(torch.ones(3))
        manager.wait()
        session.recorder.poll_pending()
        snap = records(session)
    [record] = snap["recent"]
    assert (record["op"], record["api"], record["state"]) == ("all_reduce", "all_reduce (coalesced x2)", "completed")
    assert record["shapes"] == [[2], [3]]


def test_a_destroyed_group_is_not_kept_alive_by_ddpwatch(one_rank_group):
    with ddpwatch.guard(interval=0.2):
        one_rank_group()
        group = dist.new_group([0])
        dist.all_reduce(torch.ones(2), group=group)
        dist.destroy_process_group(group)
        ref = weakref.ref(group)
        del group
        gc.collect()
        assert ref() is None
