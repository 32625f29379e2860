"""Ranks in words: [0, 1, 2, 5] -> 'ranks 0-2,5' (every renderer names ranks so)."""

from __future__ import annotations


def rank_list(ranks) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2,5'; [3] -> 'rank 3'."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts = []
    start = prev = ranks[0]
    for rank in ranks[1:]:
        if rank == prev + 1:
            prev = rank
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = rank
    parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return "ranks " + ",".join(parts)
