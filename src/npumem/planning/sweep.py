"""A first plan in O(n log n), whatever the problem's size: a sweep over time that places each
buffer, as it comes alive, in the lowest free gap below the arena's top (like an allocator
that knows nothing of the future). It is valid by construction and usually within a few percent
of the greedy orders, which cost O(n^2) and may not finish within the time limit.
"""

from __future__ import annotations

import bisect

import numpy as np

from .problem import PlanningProblem

GAPS_SCANNED = 64          # a buffer that fits none of the lowest 64 gaps goes on top


def place_by_time(problem: PlanningProblem) -> np.ndarray:
    """Offsets for every buffer: frees before allocations at the same time (lifetimes are
    half-open), larger buffers first among those that start together."""
    n = len(problem)
    offsets = np.zeros(n, np.int64)
    size = problem.size
    times = np.concatenate([problem.upper, problem.lower])
    kinds = np.concatenate([np.zeros(n, np.int8), np.ones(n, np.int8)])      # frees first
    which = np.concatenate([np.arange(n), np.arange(n)])
    sizes = np.concatenate([size, size])
    events = np.lexsort((-sizes, kinds, times))
    starts: list[int] = []                # free gaps below `top`, sorted by offset
    ends: list[int] = []
    top = 0
    placed = offsets.tolist()
    size_of = size.tolist()
    for k in (which[events] + n * kinds[events].astype(np.int64)).tolist():
        i, alloc = (k - n, True) if k >= n else (k, False)
        need = size_of[i]
        if not need:
            continue
        if alloc:
            for j in range(min(len(starts), GAPS_SCANNED)):
                if ends[j] - starts[j] >= need:
                    placed[i] = starts[j]
                    starts[j] += need
                    if starts[j] == ends[j]:
                        del starts[j], ends[j]
                    break
            else:
                placed[i] = top
                top += need
            continue
        low, high = placed[i], placed[i] + need
        at = bisect.bisect_left(starts, low)
        if at and ends[at - 1] == low:                 # merge with the gap below
            at -= 1
            low = starts[at]
            del starts[at], ends[at]
        if at < len(starts) and starts[at] == high:     # and with the gap above
            high = ends[at]
            del starts[at], ends[at]
        if high == top:
            top = low
        else:
            starts.insert(at, low)
            ends.insert(at, high)
    return np.array(placed, dtype=np.int64)
