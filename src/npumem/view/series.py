"""One device trace, precomputed once so that every request of the viewer is a slice and a
reduce: the running totals (allocated, reserved, active, and live bytes by category) as
`Levels`, each allocation's lifetime (where it ends), and the segment events.

The totals are the ones `npumem report` draws (profile.analysis.analyze_trace): allocated moves
at each alloc and at the free_requested of a live block, active at each alloc and
free_completed, reserved at the segment events, all from the state rebuilt at the first entry;
a trace that starts with memory in use is lifted as the report lifts it, and reserved is shown
as at least active. So the peak the page shows is the report's peak.

Memory: about 40 bytes an entry (time, three totals, positions of the allocs and their ends),
on top of the reader's columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.snapshot.columns import (ALLOC, FREE_COMPLETED, FREE_REQUESTED, SEGMENT_ADD,
                                      SEGMENT_REMOVE, arrays, block_order, having, index_type,
                                      levels, positions_where, sizes)
from .levels import Levels

OTHER = "other"


@dataclass
class Lifetimes:
    """The allocs of a trace in entry order and, for each, the entry that ends it (len(trace)
    when none does); `start_ends`: for the blocks live before the first entry, by address,
    the entry that ends each."""

    allocs: np.ndarray
    ends: np.ndarray
    start_ends: dict[int, int]


def category_kinds(a) -> tuple[dict[str, int], np.ndarray]:
    """Each category (the tensor recorder's; OTHER where an entry has none) numbered in order
    of first appearance, and each extra's number."""
    order: dict[str, int] = {}
    kinds = np.array([order.setdefault((extra.get("category") if isinstance(extra, dict)
                                        else None) or OTHER, len(order)) for extra in a.extras],
                     dtype=np.int64)
    return order, kinds


def lifetimes(a, free_code: int, start_addrs, allocs: np.ndarray,
              rank: np.ndarray) -> Lifetimes:
    """Each alloc's end: the next entry at its address when that is a `free_code` entry (an
    alloc over a live block leaves the first one counted for ever, as the report counts it).
    `allocs`: the allocs' positions; `rank`: each entry's number among the allocs."""
    name = {FREE_REQUESTED: "free_requested", FREE_COMPLETED: "free_completed"}[free_code]
    positions, first, actions, addrs = block_order(a, ("alloc", name))
    n = len(a)
    ends = np.full(len(allocs), n, dtype=index_type(n))
    ended = np.flatnonzero((actions[:-1] == ALLOC) & (actions[1:] == free_code) & ~first[1:])
    ends[rank[positions[ended]]] = positions[ended + 1]
    start_ends = {}
    if len(start_addrs):
        # a block live before the trace ends at the first free of its address, if that comes
        # before any alloc there
        opening = np.flatnonzero(first & (actions == free_code))
        wanted = set(start_addrs)
        for addr, at in zip(addrs[opening].tolist(), positions[opening].tolist()):
            if addr in wanted:
                start_ends[addr] = at
    return Lifetimes(allocs, ends, start_ends)


@dataclass
class CategorySeries:
    name: str
    moves: np.ndarray          # entry positions where its live bytes change
    levels: Levels             # its live bytes: 0, then after each move


class Series:
    """The precomputed totals of one device trace (`entries`) that began in the state
    `start_live` (entry dicts) with `start_reserved` bytes reserved."""

    def __init__(self, entries, start_live: list[dict], start_reserved: int):
        a = self.arrays = arrays(entries)
        n = self.n = len(a)
        action, size = a.action, sizes(a)
        self.start_live = {entry["addr"]: entry for entry in start_live}
        base = sum(entry["size"] for entry in start_live)
        allocating = action == ALLOC
        self.has_active = bool((action == FREE_COMPLETED).any() and
                               (action == FREE_REQUESTED).any())
        # lifetimes: until free_requested (allocated) and until free_completed (active; made
        # now: the walk reuses the blocks' sort just made, 0.3 s at 10M entries, where a first
        # click would otherwise wait for it)
        self._allocs = positions_where(allocating)            # (int32 below 2**31 entries)
        self._rank = np.cumsum(allocating, dtype=index_type(n))
        self._rank -= 1
        self.allocated_life = lifetimes(
            a, FREE_REQUESTED if (action == FREE_REQUESTED).any() else FREE_COMPLETED,
            list(self.start_live), self._allocs, self._rank)
        self._active_life = (lifetimes(a, FREE_COMPLETED, list(self.start_live), self._allocs,
                                       self._rank) if self.has_active else self.allocated_life)
        # allocated: + each alloc, - the free that ends a live block (as the report counts)
        change = np.where(allocating, size, 0)
        frees = self._ending_frees(self.allocated_life, a)
        change[frees] = -size[frees]
        allocated = np.cumsum(change, out=change)
        allocated += base
        if self.has_active:
            # (as the report: every free_completed counts, so that the curves are its curves)
            change = np.where(allocating, size, 0)
            completed = positions_where(action == FREE_COMPLETED)
            change[completed] = -size[completed]
            del completed
            active = np.cumsum(change, out=change)
            active += base
        else:
            active = allocated
        segments = np.flatnonzero(having(action, *SEGMENT_ADD, *SEGMENT_REMOVE))
        self.segment_positions = segments
        reserved = levels(start_reserved, np.where(having(action[segments], *SEGMENT_ADD),
                                                   size[segments], -size[segments]),
                          segments, n) if n else np.zeros(0, np.int64)
        reserved = np.asarray(reserved, dtype=np.int64)
        lows = [min(0, int(v.min())) if n else 0 for v in (allocated, reserved, active)]
        if lows[0]:
            allocated -= lows[0]
        if self.has_active and lows[2]:
            active -= lows[2]
        reserved -= lows[1]
        np.maximum(reserved, active, out=reserved)        # (active is allocated without it)
        self.allocated = Levels(allocated)
        self.reserved = Levels(reserved)
        self.active = Levels(active) if self.has_active else None
        self.categories = self._categories(a, size)

    @property
    def active_life(self) -> Lifetimes:
        return self._active_life

    @staticmethod
    def _ending_frees(life: Lifetimes, a) -> np.ndarray:
        """Positions of the frees that end a live block (allocs' ends, and start blocks')."""
        ends = life.ends[life.ends < a.__len__()]
        return np.r_[ends, np.array(list(life.start_ends.values()), dtype=ends.dtype)]

    def _categories(self, a, size) -> list[CategorySeries]:
        """Live bytes by category (the tensor recorder's), moving at each alloc and at the end
        of each allocated block; [] where no entry has a category."""
        if not any(isinstance(extra, dict) and extra.get("category") for extra in a.extras):
            return []
        order, kind_of_extra = category_kinds(a)
        life = self.allocated_life
        kind = kind_of_extra[a.extra[life.allocs]] if len(life.allocs) else \
            np.zeros(0, np.int32)
        block = size[life.allocs]
        ended = life.ends < self.n
        moves = np.r_[life.allocs, life.ends[ended]]
        change = np.r_[block, -block[ended]]
        kinds = np.r_[kind, kind[ended]]
        # blocks live before the trace count as "other", from the start
        start = [(addr, entry["size"]) for addr, entry in self.start_live.items()]
        start_bytes = sum(n for _, n in start)
        other = order.setdefault(OTHER, len(order))
        gone = [(life.start_ends[addr], n) for addr, n in start if addr in life.start_ends]
        if gone:
            moves = np.r_[moves, np.array([at for at, _ in gone], dtype=moves.dtype)]
            change = np.r_[change, -np.array([n for _, n in gone], dtype=change.dtype)]
            kinds = np.r_[kinds, np.full(len(gone), other, dtype=np.int32)]
        series = []
        for name, k in order.items():
            mine = np.flatnonzero(kinds == k)
            if not len(mine) and not (k == other and start_bytes):
                continue
            at = np.argsort(moves[mine], kind="stable")
            positions, steps = moves[mine][at], change[mine][at]
            total = np.empty(len(steps) + 1, dtype=np.int64)
            total[0] = start_bytes if k == other else 0
            np.cumsum(steps, out=total[1:])
            total[1:] += total[0]
            series.append(CategorySeries(name, positions, Levels(total)))
        return series

    # --- reading -------------------------------------------------------------------------

    def live_at(self, position: int) -> tuple[np.ndarray, list[int]]:
        """After entry `position`: the allocs live (their entry positions) and the addresses of
        the blocks live since before the trace."""
        life = self.allocated_life
        k = int(np.searchsorted(life.allocs, position, "right"))
        live = life.allocs[:k][life.ends[:k] > position]
        start = [addr for addr in self.start_live
                 if life.start_ends.get(addr, self.n) > position]
        return live, start

    def inactive_at(self, position: int) -> np.ndarray:
        """Allocs freed by the program but not yet reusable (free_requested before
        free_completed: another stream still used them) after entry `position`."""
        if not self.has_active:
            return np.zeros(0, dtype=self.allocated_life.allocs.dtype)
        life, active = self.allocated_life, self.active_life
        k = int(np.searchsorted(life.allocs, position, "right"))
        return life.allocs[:k][(life.ends[:k] <= position) & (active.ends[:k] > position)]

    def end_of(self, alloc: int) -> int | None:
        """The entry that ends the allocation made at entry `alloc` (None: never)."""
        life = self.allocated_life
        k = int(np.searchsorted(life.allocs, alloc))
        if k >= len(life.allocs) or life.allocs[k] != alloc:
            raise KeyError(alloc)
        end = int(life.ends[k])
        return None if end >= self.n else end
