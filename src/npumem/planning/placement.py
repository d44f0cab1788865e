"""A placement (one offset per buffer), its validation, and first-fit placement in a given order."""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .problem import PlanningProblem

try:
    from . import _placement as _native
except ImportError:                 # a checkout not installed with `pip install -e .`
    _native = None


class PlanError(ValueError):
    """A placement that puts two buffers live at the same time on the same bytes."""


@dataclass
class Plan:
    """Offsets for every buffer of `problem`, the arena height they need, and how they were found."""

    problem: PlanningProblem
    offsets: np.ndarray
    algorithm: str
    seconds: float = 0.0
    interrupted: bool = False          # Ctrl-C ended the work: the best plan found before it
    notes: list[str] = field(default_factory=list)   # what the time limit cut short

    @property
    def height(self) -> int:
        if len(self.offsets) == 0:
            return 0
        return int((self.offsets + self.problem.size).max())

    @property
    def height_over_load(self) -> float:
        load = self.problem.load()
        return self.height / load if load else 1.0

    def summary(self) -> dict:
        """The fields of `npumem plan --json`."""
        return {"problem": self.problem.name, "buffers": len(self.problem),
                "load_bytes": self.problem.load(), "height_bytes": self.height,
                "height_over_load": round(self.height_over_load, 6),
                "seconds": round(self.seconds, 3), "algorithm": self.algorithm,
                "interrupted": self.interrupted, "valid": True,   # (plan() validates each)
                "notes": list(self.problem.notes) + self.notes}


def validate(problem: PlanningProblem, offsets: np.ndarray) -> None:
    """Raise PlanError naming two buffers that overlap in time and in bytes, if any.

    A sweep over time keeps the live buffers sorted by offset; a new buffer only has to be checked
    against its neighbours in that order, because the live ones never overlap each other.
    """
    if len(offsets) != len(problem):
        raise PlanError(f"{len(offsets)} offsets for {len(problem)} buffers")
    if len(offsets) and offsets.min() < 0:
        i = int(np.argmin(offsets))
        raise PlanError(f"buffer {problem.ids[i]} has a negative offset {offsets[i]}")
    n = len(problem)
    times = np.concatenate([problem.upper, problem.lower])
    kinds = np.concatenate([np.zeros(n, np.int8), np.ones(n, np.int8)])   # frees first
    which = np.concatenate([np.arange(n), np.arange(n)])
    starts: list[tuple[int, int]] = []          # (offset, buffer) of live buffers, sorted
    for k in np.lexsort((kinds, times)):
        i = int(which[k])
        key = (int(offsets[i]), i)
        if kinds[k] == 0:
            if problem.size[i]:
                del starts[bisect.bisect_left(starts, key)]
            continue
        if problem.size[i] == 0:
            continue
        at = bisect.bisect_left(starts, key)
        end = key[0] + int(problem.size[i])
        for j in (at - 1, at):
            if 0 <= j < len(starts):
                other_off, other = starts[j]
                other_end = other_off + int(problem.size[other])
                if other_off < end and key[0] < other_end:
                    raise PlanError(
                        f"buffers {problem.ids[i]} and {problem.ids[other]} are live together "
                        f"(from {max(problem.lower[i], problem.lower[other])}) and overlap: "
                        f"[{key[0]}, {end}) and [{other_off}, {other_end})")
        starts.insert(at, key)


def lowest_gap(starts: np.ndarray, ends: np.ndarray, need: int, best_fit: bool = False) -> int:
    """Where a buffer of `need` bytes goes among buffers at [starts, ends) (live at the same
    time; ties in start keep their order): the lowest gap that fits, or with `best_fit` the
    tightest; else on top."""
    if not len(starts):
        return 0
    by_start = np.argsort(starts, kind="stable")
    starts = starts[by_start]
    ends = np.maximum.accumulate(ends[by_start])
    floors = np.concatenate(([0], ends[:-1]))      # top of everything below each start
    gaps = starts - floors
    fits = np.nonzero(gaps >= need)[0]
    if len(fits) == 0:
        return int(ends[-1])
    if best_fit:
        return int(floors[fits[np.argmin(gaps[fits])]])
    return int(floors[fits[0]])


@dataclass(frozen=True)
class Beat:
    """A placement to beat: a lower (pages touched, height), or a lower height where `pages` is
    None. Pages are of `page` bytes, touched by the held rows and the placed buffers; height is
    the top of the placed buffers and `height_before` (buffers placed outside the order).
    Both only grow as buffers are placed, so a placement that reaches them stops there."""

    height: int
    pages: int | None = None
    page: int = 1
    height_before: int = 0

    def __post_init__(self):
        if self.page < 1:
            raise ValueError(f"place: a page of {self.page} bytes")

    def native(self) -> tuple[int, int, int, int]:
        return (-1 if self.pages is None else self.pages, self.height, self.page,
                self.height_before)


class _Touched:
    """The pages touched so far, as disjoint intervals of page numbers (Beat)."""

    def __init__(self, page: int):
        self.page, self.low, self.high, self.count = page, [], [], 0

    def add(self, start: int, end: int) -> None:
        first, last = start // self.page, (end - 1) // self.page
        if last < first:
            return
        i = bisect.bisect_left(self.high, first)
        j = bisect.bisect_right(self.low, last, lo=i)
        if j > i:
            first, last = min(first, self.low[i]), max(last, self.high[j - 1])
            self.count -= sum(h - l + 1 for l, h in zip(self.low[i:j], self.high[i:j]))
        self.low[i:j], self.high[i:j] = [first], [last]
        self.count += last - first + 1


def place(lo, hi, first, sizes, order, best_fit: bool = False, held=None,
          deadline: float = math.inf, native: bool | None = None,
          beat: Beat | None = None) -> np.ndarray | None | bool:
    """Place buffers one by one in `order`, each in the lowest gap (or, with `best_fit`, the
    tightest) among the rows live at the same time: the rows `held` (start, end, from, until)
    and the buffers placed before it. Buffer i lives in the pieces lo/hi[first[i]:first[i+1]]
    (a step layout cuts a block crossing the step's end in two). O(n^2): None if the
    `deadline` (perf_counter) passes first, False as soon as it cannot `beat` a placement.
    The native placement (_placement.c) where built, unless `native` is False; this loop is
    its statement and oracle."""
    lo, hi, first, sizes, order = (np.ascontiguousarray(a, dtype=np.int64)
                                   for a in (lo, hi, first, sizes, order))
    held = np.zeros((0, 4), np.int64) if held is None else np.ascontiguousarray(held, np.int64)
    if native is not False and _native is not None:
        left = deadline - time.perf_counter()
        offsets = _native.place(lo, hi, first, sizes, order, best_fit, held.reshape(-1), left,
                                None if beat is None else beat.native())
        if offsets is None or offsets is False:
            return offsets
        return np.frombuffer(offsets, np.int64).copy()
    if len(np.unique(order)) != len(order) or len(order) and not 0 <= order.min() <= \
            order.max() < len(sizes):
        raise ValueError(f"place: the order must name each of {len(sizes)} buffers at most once")
    capacity = len(held) + len(lo)
    p_from, p_until = np.empty(capacity, np.int64), np.empty(capacity, np.int64)
    p_start, p_end = np.empty(capacity, np.int64), np.empty(capacity, np.int64)
    k = len(held)
    if k:
        p_start[:k], p_end[:k], p_from[:k], p_until[:k] = held.T
    touched = _Touched(beat.page if beat else 1)
    if beat is not None and beat.pages is not None:
        for start, end in held[:, :2].tolist():
            touched.add(start, end)
    height = beat.height_before if beat else 0

    def beaten() -> bool:
        if beat is None:
            return False
        if beat.pages is not None and touched.count != beat.pages:
            return touched.count > beat.pages
        return height >= beat.height

    offsets = np.zeros(len(sizes), np.int64)
    if beaten():
        return False
    for count, i in enumerate(order.tolist()):
        if count & 63 == 0 and time.perf_counter() > deadline:
            return None
        mask = np.zeros(k, bool)
        for p in range(first[i], first[i + 1]):
            mask |= (p_from[:k] < hi[p]) & (lo[p] < p_until[:k])
        live = np.nonzero(mask)[0]
        need = sizes[i]
        offset = offsets[i] = lowest_gap(p_start[live], p_end[live], need, best_fit)
        for p in range(first[i], first[i + 1]):
            p_from[k], p_until[k], p_start[k], p_end[k] = lo[p], hi[p], offset, offset + need
            k += 1
        if beat is not None:
            height = max(height, int(offset + need))
            if beat.pages is not None:
                touched.add(int(offset), int(offset + need))
            if beaten():
                return False
    return offsets


def place_in_order(problem: PlanningProblem, order: np.ndarray, best_fit: bool = False,
                   deadline: float = math.inf, beat: Beat | None = None) -> np.ndarray | None | bool:
    """`place` for a problem: each buffer one piece, [lower, upper)."""
    return place(problem.lower, problem.upper, np.arange(len(problem) + 1), problem.size, order,
                 best_fit, None, deadline, beat=beat)
