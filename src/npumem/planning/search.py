"""Depth-first search for a placement within a fixed capacity (after MiniMalloc, ASPLOS 2023).

The search only builds *canonical* placements: buffers are placed in non-decreasing order of
offset, each at its lowest possible offset (the top of the highest placed buffer it overlaps in
time). Every placement can be pushed down into that form, so nothing is lost, and the order cuts
the search space. Time is cut into sections where the set of live buffers is constant; each
section keeps its floor (nothing unplaced can go below it) and the total size of its unplaced
buffers. A partial placement is abandoned as soon as some section's floor plus that total
exceeds the capacity, because those buffers are all live together and must stack.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .problem import PlanningProblem

# Orders that break ties among buffers at the same lowest offset, larger first, letter by letter:
# T = the largest section total the buffer spans, A = area (size x lifetime), W = sections
# spanned, Z = size. Restarts pick one at random and jitter the keys.
PREORDERS = ("TWA", "WAT", "TAW", "ATW", "AWT", "WTA", "TZA", "ZTW")
DENSE_LIMIT = 4_000_000      # sections x buffers up to which the stronger floor inference is used


class SearchAborted(Exception):
    """The node or time budget ran out before the search finished."""


class SkylineSearch:
    """A reusable search over one problem; `solve(capacity, ...)` may be called many times."""

    def __init__(self, problem: PlanningProblem):
        self.problem = problem
        self.cancelled = False              # set from another thread (Ctrl-C): stop at once
        self.lower, self.upper, self.size = problem.lower, problem.upper, problem.size
        n = len(problem)
        self.first, self.last, self.total0 = problem.sections
        sections = len(self.total0)
        self.members = None
        if sections * n <= DENSE_LIMIT:
            self.members = np.zeros((sections, n), bool)
            for i in range(n):
                self.members[self.first[i]:self.last[i], i] = True
        self.keys = {"T": problem.breadth, "A": self.size * (self.upper - self.lower),
                     "W": self.last - self.first, "Z": self.size}
        self.nodes = 0

    def rank(self, preorder: str, rng: np.random.Generator | None = None,
             jitter: float = 0.1) -> np.ndarray:
        """Rank of each buffer under a preorder such as 'TAW'; with `rng`, every key is scaled by
        a random factor around 1 (about +-`jitter`), so restarts explore different orders."""
        columns = []
        for letter in reversed(preorder):
            key = self.keys[letter].astype(float)
            if rng is not None:
                key = key * np.exp(jitter * rng.standard_normal(len(key)))
            columns.append(-key)
        order = np.lexsort(columns)
        rank = np.empty(len(order), np.int64)
        rank[order] = np.arange(len(order))
        return rank

    def solve(self, capacity: int, rank: np.ndarray, node_limit: int, deadline: float):
        """Offsets of a placement within `capacity`, or None if there is none (proven).

        Raises SearchAborted when `node_limit` nodes or the `deadline` (perf_counter) is reached.
        Recursion goes one level per buffer: call it from a thread with a large stack.
        """
        n = len(self.problem)
        self.capacity, self.order_rank = capacity, rank
        self.node_limit, self.deadline = node_limit, -math.inf if self.cancelled else deadline
        self.floor = np.zeros(len(self.total0), np.int64)
        self.total = self.total0.copy()
        self.min_offset = np.zeros(n, np.int64)
        self.offsets = np.zeros(n, np.int64)
        self.unplaced = np.ones(n, bool)
        self.log: list[tuple] = []
        self.nodes = 0
        everything = np.argsort(self.first, kind="stable")
        if all(self._solve_part(part, -1) for part in self._split(everything)):
            return self.offsets.copy()
        return None

    def _split(self, group: np.ndarray) -> list[np.ndarray]:
        """`group` (sorted by first section) cut where no buffer of it spans the boundary: the
        pieces are independent, so a failure in one never sends the search back into another."""
        if len(group) <= 1:
            return [group]
        reach = np.maximum.accumulate(self.last[group])
        cuts = np.nonzero(self.first[group][1:] >= reach[:-1])[0] + 1
        return np.split(group, cuts) if len(cuts) else [group]

    def _solve_part(self, group: np.ndarray, last_key: int) -> bool:
        """Place every buffer of `group` (one independent part); on failure undo what it did."""
        if len(group) == 0:
            return True
        n, size, min_offset = len(self.problem), self.size, self.min_offset
        offsets = min_offset[group]
        keys = offsets * n + self.order_rank[group]
        tops = offsets + size[group]
        # Skipping a buffer that could sit below the lowest top would leave a useless gap.
        usable = (keys >= last_key) & (offsets < tops.min()) & (tops <= self.capacity)
        candidates = group[usable][np.argsort(keys[usable])]
        sections = slice(int(self.first[group].min()), int(self.last[group].max()))
        mark = len(self.log)
        for i in candidates:
            self.nodes += 1
            if self.nodes > self.node_limit or (self.nodes & 63 == 0
                                                and time.perf_counter() > self.deadline):
                raise SearchAborted
            offset = int(min_offset[i])
            self._place(i, offset)
            if self._feasible(offset, sections):
                rest = group[group != i]
                parts = self._split(rest)
                if len(parts) == 1:
                    if self._solve_part(rest, offset * n + int(self.order_rank[i])):
                        return True
                elif all(self._solve_part(part, -1) for part in parts):
                    return True
            self._rollback(mark)
        return False

    def _place(self, i: int, offset: int) -> None:
        top = offset + self.size[i]
        a, b = self.first[i], self.last[i]
        self.unplaced[i] = False
        self.offsets[i] = offset
        neighbours = np.nonzero(self.unplaced & (self.lower < self.upper[i])
                                & (self.lower[i] < self.upper))[0]
        self.log.append((i, neighbours, self.min_offset[neighbours].copy(), self.floor[a:b].copy()))
        self.min_offset[neighbours] = np.maximum(self.min_offset[neighbours], top)
        self.floor[a:b] = top
        self.total[a:b] -= self.size[i]

    def _rollback(self, mark: int) -> None:
        while len(self.log) > mark:
            i, neighbours, old_offsets, old_floor = self.log.pop()
            a, b = self.first[i], self.last[i]
            self.min_offset[neighbours] = old_offsets
            self.floor[a:b] = old_floor
            self.total[a:b] += self.size[i]
            self.unplaced[i] = True

    def _feasible(self, offset: int, sections: slice) -> bool:
        """Whether the unplaced buffers of each section can still stack under the capacity.
        Everything placed from now on sits at `offset` or higher (the canonical order)."""
        total = self.total[sections]
        bottom = np.maximum(self.floor[sections], offset)
        if self.members is not None:
            lowest = np.where(self.members[sections] & self.unplaced, self.min_offset,
                              np.iinfo(np.int64).max).min(axis=1)
            bottom = np.maximum(bottom, np.where(total > 0, lowest, 0))
        return bool((bottom + total).max() <= self.capacity)
