"""The leader's look stays linear in the ranks it reads: counted, never timed (a busy machine cannot fail it)."""

from __future__ import annotations

from ddpwatch import analysis
from ddpwatch.analysis import reading

GRACE, TIMEOUT = 0.5, 300.0


class CountingState(dict):
    """A rank's state that counts the reads of its groups (what members() scanned, state by state)."""

    reads = 0

    def get(self, key, default=None):
        if key == "groups":
            CountingState.reads += 1
        return super().get(key, default)


def blocked(rank: int, group: str, members: list | None, seq: int = 4) -> CountingState:
    record = {"seq": seq, "group": group, "op": "all_reduce", "api": "all_reduce", "state": "in_flight"}
    record.update(age_s=3.0, start=1.0, site={"file": "/u/train.py", "line": 20, "function": "f"})
    return CountingState(
        rank=rank, status="running", idle_s=3.0, progress=1, inflight=[record], groups={group: members}
    )


def test_a_look_at_ranks_in_many_small_groups_reads_each_states_groups_a_bounded_number_of_times():
    # 512 ranks in 64 tensor-parallel groups of 8, the last group's ranks in the world's barrier instead: the
    # crossing pass asks each waiting rank's group members; a scan of every state per ask read groups 512 x 512 times
    world = 512
    states = {
        r: blocked(r, str(1 + r // 8), list(range(r // 8 * 8, r // 8 * 8 + 8)))
        if r < world - 8
        else blocked(r, "0", None)
        for r in range(world)
    }
    CountingState.reads = 0
    analysis.assess(states, world, GRACE, TIMEOUT)
    assert CountingState.reads <= 4 * world


def test_members_reads_the_first_state_that_lists_the_group_and_never_a_stale_index():
    first = {0: {"groups": {"a": None}}, 1: {"groups": {"a": [1, 2]}}, 2: {"groups": {"a": [2, 3]}}}
    assert reading.members(first, "a", 4) == [1, 2]
    assert reading.members(first, "b", 4) == [0, 1, 2, 3]  # nobody lists it: every rank
    other = {0: {"groups": {"a": [0, 3]}}}
    assert reading.members(other, "a", 4) == [0, 3]  # another look's states: read anew
    other[1] = {"groups": {"b": [1]}}
    assert reading.members(other, "b", 4) == [1]  # the same states, a rank more: read anew
    listed = reading.members(other, "a", 4)
    listed.append(9)
    assert reading.members(other, "a", 4) == [0, 3]  # a caller's list is its own


class CountingWaits(dict):
    """The waiting ranks' records, counting each ask whether a rank waits."""

    asks = 0

    def __contains__(self, rank) -> bool:
        CountingWaits.asks += 1
        return super().__contains__(rank)


def test_the_crossing_pass_asks_once_per_group_member_not_once_per_waiting_rank_and_member():
    # 504 ranks in the world's barrier; 8 in a barrier of a group with ranks 0-7, which wait in the world's: a crossing.
    # Asked per waiting rank, each of the 504 scanned the world's 512 members (254,016 asks)
    from ddpwatch.analysis.passes import group_order

    world = 512
    nine = list(range(8)) + list(range(world - 8, world))
    states = {r: blocked(r, "0", None) if r < world - 8 else blocked(r, "9", nine) for r in range(world)}
    waiting = CountingWaits({rank: state["inflight"][0] for rank, state in states.items()})
    CountingWaits.asks = 0
    found = group_order(waiting, states, world)
    assert found is not None and found["kind"] == "group_order"  # what it counts did happen: a crossing, proven
    assert CountingWaits.asks <= 4 * world


def send(rank: int, peer: int) -> dict:
    record = {"seq": 1, "group": "0", "op": "send", "api": "send", "p2p": True, "peer": peer, "state": "in_flight"}
    record.update(age_s=3.0, start=1.0, site={"file": "/u/train.py", "line": 30, "function": "stage"})
    return {"rank": rank, "status": "running", "idle_s": 3.0, "progress": 1, "inflight": [record], "groups": {}}


def test_a_send_cycle_of_many_ranks_pairs_each_op_with_its_peers_ops_only(monkeypatch):
    # 256 pipeline stages each in a blocking send to the next: a cycle nobody receives in. Each send was tried
    # against every other rank's ops (65,280 pairings); only its peer's can pair with it
    from ddpwatch.analysis import p2p

    world = 256
    states = {r: send(r, (r + 1) % world) for r in range(world)}
    pairings = []
    match = p2p.p2p_match
    monkeypatch.setattr(p2p, "p2p_match", lambda a, b: pairings.append(1) or match(a, b))
    waiting = {rank: state["inflight"][0] for rank, state in states.items()}
    found = p2p.p2p_deadlock(waiting, states, world)
    assert found is not None and found["kind"] == "p2p_deadlock"  # what it counts did happen: the cycle, proven
    assert len(pairings) <= 4 * world


def test_a_hang_of_many_ranks_in_one_collective_beside_a_send_asks_its_members_once(monkeypatch):
    # 255 ranks in the world's all_reduce, rank 255 in a send to rank 0: each of the 255 asked which members lack
    # the all_reduce, a scan of the world's 256 members each (65,280)
    from ddpwatch.analysis import p2p

    world = 256
    states = {r: blocked(r, "0", None) for r in range(world - 1)}
    states[world - 1] = send(world - 1, 0)
    asked = []
    members = p2p.members
    monkeypatch.setattr(p2p, "members", lambda *args: asked.append(1) or members(*args))
    waiting = {rank: state["inflight"][0] for rank, state in states.items()}
    found = p2p.p2p_deadlock(waiting, states, world)
    assert found is not None and found["kind"] == "p2p_deadlock"
    assert len(asked) <= 4


def test_a_look_at_half_the_ranks_exited_asks_each_waiting_groups_members_once(monkeypatch):
    # 256 ranks wait in a barrier, the other 256 exited: "which exited ranks are members" called members() once per
    # exited rank (a list of the world each time)
    from ddpwatch.analysis import departure, passes

    world = 512
    states = {r: blocked(r, "0", None) for r in range(world)}
    for rank in range(1, world, 2):
        states[rank]["status"] = "exited"
    asked = []
    for module in (departure, passes):
        members = module.members
        monkeypatch.setattr(module, "members", lambda *args, members=members: asked.append(1) or members(*args))
    found = analysis.assess(states, world, GRACE, TIMEOUT)
    assert found.verdict is not None and found.findings  # what it counts did happen: the exited ranks judged
    assert len(asked) <= 8
