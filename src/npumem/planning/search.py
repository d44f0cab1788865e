"""Depth-first search for a placement within a fixed capacity (after MiniMalloc, ASPLOS 2023).

The search only builds *canonical* placements: buffers are placed in non-decreasing order of
offset, each at its lowest possible offset (the top of the highest placed buffer it overlaps in
time). Every placement can be pushed down into that form, so nothing is lost, and the order cuts
the search space. Time is cut into sections where the set of live buffers is constant; each
section keeps its floor (nothing unplaced can go below it) and the total size of its unplaced
buffers. A partial placement is abandoned as soon as some section's floor plus that total
exceeds the capacity, because those buffers are all live together and must stack.

A buffer with nothing unplaced beside it in time ("hatless", MiniMalloc's term) ends its level
when the search under it fails: no other candidate can do better. Its lowest offset never
changes, and any other candidate comes after it in the order (offset, then rank), so in every
branch that places another first it could only be placed against the canonical order.

`_search` (C) runs the same search, node for node, where it is built; this one is its oracle
(tests/test_search_native.py).
"""

from __future__ import annotations

import math
import time

import numpy as np

from .problem import PlanningProblem

try:
    from . import _search as native
except ImportError:                 # a checkout not installed with `pip install -e .`
    native = None

# Orders that break ties among buffers at the same lowest offset, larger first, letter by letter:
# T = the largest section total the buffer spans, A = area (size x lifetime), W = lifetime
# (width in time), C = sections spanned, Z = size. The first three are MiniMalloc's; restarts
# take each in turn, then the others at random with their keys jittered.
PREORDERS = ("WAT", "TAW", "TWA", "TCA", "CAT", "ATC", "ACT", "CTA", "TZA", "ZTC")
FIRST_ORDERS = 3
DENSE_LIMIT = 4_000_000      # sections x buffers up to which the stronger floor inference is used
CANDIDATES = 32              # next candidates a level keeps; more are found again when needed
SHORT_SPAN = 64              # sections of floor the undo log copies as they are; longer: as runs
LOG_BUDGET = 8_000_000       # neighbours' old offsets the undo log keeps (12 bytes each); beyond
                             # it they are found again from the floor: slower, but no memory
_NEVER = np.iinfo(np.int64).max


class SearchAborted(Exception):
    """The node or time budget ran out before the search finished."""


class SkylineSearch:
    """A reusable search over one problem; `solve(capacity, ...)` may be called many times."""

    def __init__(self, problem: PlanningProblem, use_native: bool | None = None):
        """`use_native` None: the C search where it is built; False: this one."""
        self.problem = problem
        self.use_native = native is not None if use_native is None else use_native
        self._cancel = np.zeros(1, np.uint8)    # read by the C search while it runs
        self.lower, self.upper, self.size = (np.ascontiguousarray(a, np.int64) for a in (
            problem.lower, problem.upper, problem.size))
        n = len(problem)
        self.first, self.last, self.total0 = problem.sections
        self.first, self.last = (np.ascontiguousarray(a, np.int64) for a in (self.first, self.last))
        sections = len(self.total0)
        self.dense = sections * n <= DENSE_LIMIT
        self.members = None
        if self.dense and not self.use_native:
            self.members = np.zeros((n, sections), bool)      # a row per buffer
            for i in range(n):
                self.members[i, self.first[i]:self.last[i]] = True
        self.by_first = np.argsort(self.first, kind="stable").astype(np.int64)
        # where buffers starting at each section begin in by_first
        self.starting = np.searchsorted(self.first[self.by_first],
                                        np.arange(sections + 1)).astype(np.int64)
        width = self.upper - self.lower
        self.keys = {"T": problem.breadth, "A": self.size * width, "W": width,
                     "C": self.last - self.first, "Z": self.size}
        self.nodes = 0

    @property
    def cancelled(self) -> bool:
        """Set from another thread (Ctrl-C): the search stops at once."""
        return bool(self._cancel[0])

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self._cancel[0] = bool(value)

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

    def solve(self, capacity: int, rank: np.ndarray, node_limit: int, deadline: float,
              preorder: str | None = None):
        """Offsets of a placement within `capacity`, or None if there is none (proven).

        With `preorder` (what `rank` was made from, without jitter), each independent part
        that splits off is ranked again by it, its T from the current section totals, as
        MiniMalloc does. Raises SearchAborted when `node_limit` nodes or the `deadline`
        (perf_counter) is reached. Recursion goes one level per buffer: call it from a thread
        with a large stack.
        """
        order = None if preorder is None else tuple(
            None if letter == "T" else np.ascontiguousarray(self.keys[letter], np.int64)
            for letter in preorder)
        if self.use_native:
            status, offsets, self.nodes = native.solve(
                self.first, self.last, self.size, self.lower, self.upper,
                np.ascontiguousarray(rank, np.int64), self.by_first, self.starting,
                self.dense, capacity, node_limit, -math.inf if self.cancelled else deadline,
                self._cancel, order)
            if status < 0:
                raise SearchAborted
            return np.frombuffer(offsets, np.int64).copy() if status else None
        n, sections = len(self.problem), len(self.total0)
        self.capacity, self.order_rank, self.order = capacity, np.array(rank, np.int64), order
        self.node_limit, self.deadline = node_limit, -math.inf if self.cancelled else deadline
        self.floor = np.zeros(sections + 1, np.int64)    # one spare: reduceat takes index `last`
        self.total = self.total0.copy()
        self.min_offset = np.zeros(n, np.int64)
        self.offsets = np.zeros(n, np.int64)
        self.unplaced = np.ones(n, bool)
        self.log: list[tuple] = []
        self.logged = 0                     # neighbours in the log
        self.ready = None                   # a part and its group, from _split
        self.nodes = 0
        everything = (0, sections)
        parts = self._split(everything, self._group(*everything))
        if self._solve_part(everything, -1) if len(parts) == 1 else self._solve_pieces(parts):
            return self.offsets.copy()
        return None

    # Memory is bounded however deep or long the search runs (it was O(buffers^2), 10 GB on
    # somas and iopddl): a level of the recursion holds no array of its group (the unplaced
    # buffers whose first section is in a range, found again when needed), only a few next
    # candidates; the undo log keeps the floor a placement covered as runs (a skyline: O(buffers)
    # runs in all), and the neighbours' old offsets only up to LOG_BUDGET.

    def _group(self, start: int, stop: int) -> np.ndarray:
        """The unplaced buffers whose first section is in [start, stop), sorted by it."""
        group = self.by_first[self.starting[start]:self.starting[stop]]
        return group[self.unplaced[group]]

    def _split(self, part: tuple[int, int], group: np.ndarray) -> list[tuple[int, int]]:
        """`group`, the unplaced buffers of `part` (a range of first sections), cut where none
        of them spans the boundary, as ranges: the pieces are independent, so a failure in one
        never sends the search back into another."""
        reach = np.maximum.accumulate(self.last[group])
        bounds = self.first[group[np.nonzero(self.first[group][1:] >= reach[:-1])[0] + 1]]
        if len(bounds) == 0:
            self.ready = part, group        # what _solve_part(part) looks for first
            return [part]
        edges = [part[0], *bounds.tolist(), part[1]]
        return list(zip(edges[:-1], edges[1:]))

    def _solve_part(self, part: tuple[int, int], last_key: int) -> bool:
        """Place every buffer of `part` (one independent part); on failure undo what it did."""
        n, min_offset, rank = len(self.problem), self.min_offset, self.order_rank
        mark = len(self.log)
        tried = last_key - 1                # candidates are taken in key order, above this
        while True:
            # The state is the same as on entry whenever this runs, so are the candidates.
            ready, self.ready = self.ready, None
            group = ready[1] if ready and ready[0] == part else self._group(*part)
            del ready
            if len(group) == 0:
                return True
            offsets = min_offset[group]
            keys = offsets * n + rank[group]
            sizes = self.size[group]
            tops = offsets + sizes
            # Skipping a buffer that could sit below the lowest top would leave a useless gap.
            # (A buffer of no bytes sits below nothing: one that is the lowest top is placed.)
            held = tops[sizes > 0]
            lowest_top = held.min() if len(held) else _NEVER
            usable = (keys > tried) & (offsets < lowest_top) & (tops <= self.capacity)
            keys = keys[usable]
            nearest = np.argsort(keys)[:CANDIDATES]
            candidates, keys = group[usable][nearest], keys[nearest]          # copies
            sections = slice(int(self.first[group[0]]), int(self.last[group].max()))
            del group, offsets, sizes, tops, held, usable, nearest    # (views of all of them)
            if not len(candidates):
                return False
            for i, key in zip(candidates, keys):
                self.nodes += 1
                if self.nodes > self.node_limit or (self.nodes & 63 == 0
                                                    and time.perf_counter() > self.deadline):
                    raise SearchAborted
                offset = int(min_offset[i])
                hatless = not self._place(i, offset)
                rest = self._group(*part)
                parts = self._split(part, rest) if self._feasible(offset, sections, rest) else ()
                del rest
                if len(parts) == 1:
                    if self._solve_part(part, key):
                        return True
                elif parts and self._solve_pieces(parts):
                    return True
                self._rollback(mark)
                if hatless:     # nothing unplaced lives beside it: see the module's doc
                    return False
                tried = key

    def _solve_pieces(self, parts: list[tuple[int, int]]) -> bool:
        """Independent parts one after the other, each ranked again first with an order."""
        for piece in parts:
            group = ranks = None
            if self.order is not None:
                group = self._group(*piece)
                ranks = self.order_rank[group]
                busiest = np.array([self.total[self.first[j]:self.last[j]].max(initial=0)
                                    for j in group.tolist()], np.int64)
                keys = [busiest if k is None else k[group] for k in self.order]
                ordered = np.lexsort([group, *(-k for k in reversed(keys))])
                self.order_rank[group[ordered]] = np.arange(len(group))
            try:
                solved = self._solve_part(piece, -1)
            finally:
                if group is not None:
                    self.order_rank[group] = ranks
            if not solved:
                return False
        return True

    def _overlapping(self, i: int) -> np.ndarray:
        """The unplaced buffers live at the same time as buffer `i`."""
        return np.nonzero(self.unplaced & (self.lower < self.upper[i])
                          & (self.lower[i] < self.upper))[0]

    def _place(self, i: int, offset: int) -> int:
        """Place buffer `i`; how many unplaced buffers live beside it."""
        top = offset + self.size[i]
        a, b = self.first[i], self.last[i]
        self.unplaced[i] = False
        self.offsets[i] = offset
        old = self.floor[a:b]
        if b - a > SHORT_SPAN:              # as runs: O(buffers) of them in the whole log
            starts = np.flatnonzero(old[1:] != old[:-1]) + 1
            lengths = np.diff(starts, prepend=0, append=b - a)
            old = (lengths, old[np.concatenate(([0], starts))])
        else:
            old = old.copy()
        neighbours = self._overlapping(i)
        if self.logged + len(neighbours) <= LOG_BUDGET:     # their old offsets, while that fits
            self.logged += len(neighbours)
            self.log.append((i, old, neighbours.astype(np.int32),
                             self.min_offset[neighbours]))
        else:
            self.log.append((i, old, None, None))
        self.min_offset[neighbours] = np.maximum(self.min_offset[neighbours], top)
        self.floor[a:b] = top
        self.total[a:b] -= self.size[i]
        return len(neighbours)

    def _rollback(self, mark: int) -> None:
        """Undo placements back to `mark`. Without their old offsets, a neighbour's lowest
        offset is the highest floor over its sections; only those that `i` raised to its top
        need it taken again."""
        while len(self.log) > mark:
            i, old, neighbours, old_offsets = self.log.pop()
            a, b = self.first[i], self.last[i]
            self.floor[a:b] = np.repeat(old[1], old[0]) if isinstance(old, tuple) else old
            self.total[a:b] += self.size[i]
            if neighbours is not None:
                self.logged -= len(neighbours)
                self.min_offset[neighbours] = old_offsets
            else:
                neighbours = self._overlapping(i)
                raised = neighbours[self.min_offset[neighbours] == self.offsets[i] + self.size[i]]
                if len(raised):
                    bounds = np.empty(2 * len(raised), np.int64)
                    bounds[0::2], bounds[1::2] = self.first[raised], self.last[raised]
                    self.min_offset[raised] = np.maximum.reduceat(self.floor, bounds)[0::2]
            self.unplaced[i] = True

    def _feasible(self, offset: int, sections: slice, rest: np.ndarray) -> bool:
        """Whether the unplaced buffers of each section can still stack under the capacity.
        Everything placed from now on sits at `offset` or higher (the canonical order). `rest`
        are the part's unplaced buffers: no other unplaced buffer lives in its `sections`."""
        total = self.total[sections]
        bottom = np.maximum(self.floor[sections], offset)
        if self.members is not None and len(rest):
            lowest = np.where(self.members[rest, sections], self.min_offset[rest, None],
                              _NEVER).min(axis=0)
            bottom = np.maximum(bottom, np.where(total > 0, lowest, 0))
        return bool((bottom + total).max() <= self.capacity)
