"""Folding the Flight Recorder's entries to one per library call (watch/flight_calls.py), on hand-built entries and
call windows: DDP's buffer broadcast is one record, two forwards in a row are two, a user's loop stays a loop."""

from ddpwatch.watch.flight_calls import fold, merged

T0 = 1_700_000_000_000_000_000  # the system clock, in ns, as time_created_ns has it
MAIN, OTHER = 1001, 1002


def op(record_id, seq, at, name="broadcast", thread=MAIN, group="0", retired=True, size=4, dtype="Float"):
    """An entry as the Flight Recorder dumps it, created `at` ns after T0."""
    return {
        "record_id": record_id,
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{name}",
        "process_group": (group, "default_pg"),
        "thread_id": str(thread),
        "retired": retired,
        "state": "scheduled",
        "input_sizes": [[size]],
        "input_dtypes": [dtype],
        "time_created_ns": T0 + at,
        "is_p2p": False,
    }


def call(start, end, thread=MAIN):
    return (thread, T0 + start, None if end is None else T0 + end)


def seqs(entries):
    return [entry["collective_seq_id"] for entry in entries]


def test_the_broadcasts_of_one_buffer_sync_are_one_entry_with_every_buckets_tensors():
    entries = [op(0, 1, 10, size=8), op(1, 2, 20, size=1, dtype="Long"), op(2, 3, 40, name="all_reduce")]
    [sync, reduce] = fold(entries, [call(5, 30)])
    assert (sync["collective_seq_id"], sync["profiling_name"], sync["folded_ops"]) == (1, "gloo:broadcast", 2)
    assert sync["input_sizes"] == [[8], [1]] and sync["input_dtypes"] == ["Float", "Long"]
    assert reduce is entries[2], "an entry outside every call passes through as it came"


def test_two_forwards_one_after_the_other_stay_two_records():
    entries = [op(0, 1, 10), op(1, 2, 11), op(2, 3, 30), op(3, 4, 31)]
    assert seqs(fold(entries, [call(5, 20), call(25, 40)])) == [1, 3]


def test_a_users_own_loop_of_collectives_is_not_folded():
    entries = [op(i, i + 1, 10 * i, name="all_reduce") for i in range(4)]
    assert fold(entries, []) == entries
    assert seqs(fold(entries, [call(100, 200)])) == [1, 2, 3, 4]  # a call before or after them holds none


def test_a_call_still_running_holds_every_later_entry_of_its_thread_and_is_in_flight_until_all_are_done():
    entries = [op(0, 1, 10), op(1, 2, 20, retired=False), op(2, 3, 30, retired=False)]
    [running] = fold(entries, [call(5, None)])
    assert (running["collective_seq_id"], running["folded_ops"], running["retired"]) == (1, 3, False)
    [done] = fold([dict(e, retired=True) for e in entries], [call(5, None)])
    assert done["retired"] is True and done["state"] == "completed"


def test_a_call_read_while_it_closes_is_seen_open_and_finished_and_kept_finished():
    entries = [op(0, 1, 10), op(1, 2, 20), op(2, 3, 50)]
    assert seqs(fold(entries, [call(5, 30), call(5, None)])) == [1, 3]


def test_another_threads_ops_inside_the_window_are_not_the_calls():
    entries = [op(0, 1, 10), op(1, 1, 15, thread=OTHER, group="1"), op(2, 2, 20), op(3, 2, 25, thread=OTHER, group="1")]
    folded = fold(entries, [call(5, 30)])
    assert [(e["process_group"][0], e["collective_seq_id"]) for e in folded] == [("0", 1), ("1", 1), ("1", 2)]


def test_one_call_on_two_groups_is_one_entry_per_group():
    entries = [op(0, 1, 10), op(1, 1, 12, group="1"), op(2, 2, 14), op(3, 2, 16, group="1")]
    folded = fold(entries, [call(5, 30)])
    assert [(e["process_group"][0], e["collective_seq_id"], e["folded_ops"]) for e in folded] == [
        ("0", 1, 2),
        ("1", 1, 2),
    ]


def test_point_to_point_entries_and_odd_windows_pass_through():
    send = dict(op(0, 0, 10, name="send"), is_p2p=True, collective_seq_id=0)
    entries = [send, op(1, 1, 12), op(2, 2, 14)]
    folded = fold(entries, [("x", 1, 2), (MAIN,), call(5, 30)])
    assert folded[0] is send and seqs(folded[1:]) == [1]
    no_time = [dict(e, time_created_ns=None) for e in entries[1:]]
    assert fold(no_time, [call(5, 30)]) == no_time


def test_merging_one_entry_gives_it_back_as_it_is():
    single = op(0, 1, 10)
    assert merged([single]) is single
