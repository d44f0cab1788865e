"""Live bytes over a trace: each live block's start and end as a change of the total, in
entry order. Steps, leaks and the step learner's check all read the same changes.

A live block is what an alloc made at its address until the first free_requested or
free_completed there; an alloc over a live block replaces it, and the bytes of the one replaced
stay counted (the trace never freed them).
"""

from __future__ import annotations

import numpy as np

from ..trace.snapshot.columns import ALLOC, block_order, index_type, sizes


def live_changes(a) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions of the allocs and of the frees that end a live block, in entry order; the
    alloc each belongs to; the bytes each adds). Made once per trace."""
    known = a.cache.get("live_changes")
    if known is None:
        positions, first, actions, _ = block_order(a)
        ends = np.flatnonzero((actions[1:] != ALLOC) & (actions[:-1] == ALLOC) & ~first[1:]) + 1
        owner = np.full(len(a), -1, dtype=index_type(len(a)))
        allocs = np.flatnonzero(a.action == ALLOC)
        owner[allocs] = allocs
        owner[positions[ends]] = positions[ends - 1]
        moves = np.flatnonzero(owner >= 0).astype(owner.dtype)
        owner = owner[moves]
        size = sizes(a)[owner]
        known = a.cache["live_changes"] = (moves, owner,
                                           np.where(moves == owner, size, -size))
    return known


def live_before(a, positions: np.ndarray) -> np.ndarray:
    """The live bytes just before each of the sorted entry `positions` (blocks made before the
    trace began are not counted: they are a constant that no comparison here needs)."""
    moves, _, change = live_changes(a)
    change = change.astype(np.float64 if change.dtype == object else np.int64)   # (past int64)
    total = np.r_[np.zeros(1, dtype=change.dtype), np.cumsum(change)]
    return total[np.searchsorted(moves, np.asarray(positions, dtype=np.int64))]
