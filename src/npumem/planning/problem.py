"""A planning problem: buffers with known lifetimes and sizes, to be placed in one arena.

Buffer `i` of `size[i]` bytes is live on the half-open interval `[lower[i], upper[i])`. The
problems come from CSV files (`id,lower,upper,size`, the format of MiniMalloc's and idealloc's
benchmarks) or from allocation traces, where time is the event number.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable

import numpy as np

from ..events import TraceEvent
from ..file_paths import not_a_file


class ProblemFormatError(ValueError):
    """A problem file that cannot be read; names the file, the line and what is wrong."""

    def __init__(self, path: str, line: int | str, reason: str):
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}:{line}: {reason}" if line != "" else f"{path}: {reason}")

    def __reduce__(self):
        return type(self), (self.path, self.line, self.reason)


@dataclass(frozen=True)
class PlanningProblem:
    """Arrays of equal length: `ids` (labels), `lower`, `upper` (lifetime) and `size` (bytes)."""

    ids: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    size: np.ndarray
    name: str = ""
    notes: list[str] = field(default_factory=list)    # what reading its trace changed

    def __post_init__(self):
        n = len(self.ids)
        if not (len(self.lower) == len(self.upper) == len(self.size) == n):
            raise ValueError("ids, lower, upper and size must have the same length")
        bad = np.nonzero((self.upper <= self.lower) | (self.size < 0))[0]
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"buffer {self.ids[i]}: needs lower < upper and size >= 0, got "
                             f"lower={self.lower[i]}, upper={self.upper[i]}, size={self.size[i]}")

    def __len__(self) -> int:
        return len(self.ids)

    @cached_property
    def sections(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Time cut into sections where the set of live buffers is constant: each buffer's first
        section, one past its last, and the bytes live in each section."""
        points = np.unique(np.concatenate([self.lower, self.upper]))
        first = np.searchsorted(points, self.lower)
        last = np.searchsorted(points, self.upper)
        delta = np.zeros(len(points), np.int64)
        np.add.at(delta, first, self.size)
        np.add.at(delta, last, -self.size)
        return first, last, np.cumsum(delta)[:max(len(points) - 1, 0)]

    @cached_property
    def breadth(self) -> np.ndarray:
        """For each buffer, the most bytes live at any moment of its lifetime: range maxima
        over the sections from a sparse table, O(n log n)."""
        first, last, live = self.sections
        if len(live) == 0:
            return np.zeros(len(self), np.int64)
        table = [live]
        while (1 << len(table)) <= len(live):
            half = 1 << (len(table) - 1)
            table.append(np.maximum(table[-1][:-half], table[-1][half:]))
        level = np.log2(np.maximum(last - first, 1)).astype(np.int64)
        result = np.empty(len(self), np.int64)
        for k in np.unique(level):          # max of the two 2**k windows covering [first, last)
            rows = np.nonzero(level == k)[0]
            row = table[k]
            result[rows] = np.maximum(row[first[rows]], row[last[rows] - (1 << k)])
        return result

    def load(self) -> int:
        """LOAD: the largest sum of sizes live at one moment. No placement is lower."""
        live = self.sections[2]
        return int(live.max()) if len(live) else 0


def problem_from_arrays(lower, upper, size, ids=None, name: str = "",
                        notes=()) -> PlanningProblem:
    lower = np.asarray(lower, dtype=np.int64)
    ids = np.arange(len(lower)) if ids is None else np.asarray(ids)
    return PlanningProblem(ids, lower, np.asarray(upper, dtype=np.int64),
                           np.asarray(size, dtype=np.int64), name, list(notes))


# Sizes and times up to this keep the planner's 64-bit sums exact (2**15 buffers of this size
# would have to be live at once to overflow them); no device holds more.
MAX_VALUE = 1 << 48
# The per-value cap does not bound a sum: 2**15 buffers of 2**48 bytes overflow. Every offset,
# top and live total the planner computes is at most the sum of all sizes, so that sum is
# capped, with room to spare for a sum of two of them (issue 64).
MAX_TOTAL = 1 << 61


def _too_much(total: int) -> str:
    return (f"the sizes up to here sum to {total} bytes, past 2**61 ({MAX_TOTAL}), more than "
            "the planner's 64-bit offsets hold (and far more than any device holds)")


def read_problem(path: str | os.PathLike) -> PlanningProblem:
    """Read an `id,lower,upper,size` CSV file (a header line is required)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ProblemFormatError(path, "", not_a_file(path))
    try:
        # (utf-8-sig: a byte-order mark, as Excel writes one, is read past)
        handle = open(path, newline="", encoding="utf-8-sig", errors="strict")
    except OSError as exc:
        raise ProblemFormatError(path, 0, f"cannot open: {exc.strerror}") from None
    try:
        return _read_rows(path, handle)
    except UnicodeDecodeError as exc:
        raise ProblemFormatError(path, 0, f"not UTF-8 text (byte {exc.start}: "
                                 f"{exc.object[exc.start:exc.start + 1]!r})") from None


def _read_rows(path: str, handle) -> PlanningProblem:
    ids, lower, upper, size = [], [], [], []
    first_line: dict[str, int] = {}          # each id's line
    total = 0
    with handle:
        reader = csv.reader(handle)
        header = [cell.strip().lower() for cell in next(reader, [])]
        if header[:4] != ["id", "lower", "upper", "size"]:
            raise ProblemFormatError(path, 1, f"expected the header id,lower,upper,size, got "
                                     f"{','.join(header) or 'an empty file'}")
        for row in reader:
            line = reader.line_num
            if not row or not "".join(row).strip():
                continue
            if len(row) != len(header):
                raise ProblemFormatError(path, line, f"expected {len(header)} fields, as the "
                                         f"header names, got {len(row)}")
            try:
                lo, up, sz = int(row[1]), int(row[2]), int(row[3])
            except ValueError:
                raise ProblemFormatError(path, line, f"lower, upper and size must be integers, "
                                         f"got {row[1:4]}") from None
            if up <= lo or sz < 0:
                raise ProblemFormatError(path, line, f"buffer {row[0]}: needs lower < upper and "
                                         f"size >= 0, got lower={lo}, upper={up}, size={sz}")
            if max(abs(lo), abs(up), sz) > MAX_VALUE:
                raise ProblemFormatError(path, line, f"buffer {row[0]}: lower, upper and size "
                                         f"must be at most 2**48 ({MAX_VALUE}), got {row[1:4]}")
            total += sz
            if total > MAX_TOTAL:
                raise ProblemFormatError(path, line, f"buffer {row[0]}: {_too_much(total)}")
            name = row[0].strip()
            if name in first_line:
                raise ProblemFormatError(path, line, f"buffer id {name!r} again (first on line "
                                         f"{first_line[name]}): each buffer needs its own id")
            first_line[name] = line
            ids.append(name)
            lower.append(lo)
            upper.append(up)
            size.append(sz)
    return problem_from_arrays(lower, upper, size, np.array(ids, dtype=object),
                               os.path.basename(path))


def problem_from_trace(events: Iterable[TraceEvent], name: str = "",
                       size_of: Callable[[int], int] | None = None,
                       notes=()) -> PlanningProblem:
    """Lifetimes from an allocation trace, one buffer per allocation in allocation order; time
    is the event number. A block allocated again without a free ends there; blocks still live at
    the end live until the end; frees of blocks allocated before the recording are ignored.
    `size_of` maps a requested size to the bytes to plan (default: as requested); `notes`: how
    the trace was read."""
    open_at: dict[int, int] = {}              # address -> index of its live buffer
    lower, upper, size = [], [], []
    clock = total = 0
    for clock, event in enumerate(events):
        index = open_at.pop(event.addr, None)
        if index is not None:
            upper[index] = clock
        if event.action == "alloc":
            nbytes = size_of(event.size) if size_of else event.size
            if not 0 <= nbytes <= MAX_VALUE:     # as read_problem: int64 arithmetic stays exact
                raise ProblemFormatError(name or "trace", f"event {clock}",
                                         f"an allocation of {nbytes} bytes: sizes must be at "
                                         f"most 2**48 ({MAX_VALUE}) to plan")
            total += nbytes
            if total > MAX_TOTAL:
                raise ProblemFormatError(name or "trace", f"event {clock}", _too_much(total))
            open_at[event.addr] = len(lower)
            lower.append(clock), upper.append(-1)
            size.append(nbytes)
    for index in open_at.values():
        upper[index] = clock + 1
    return problem_from_arrays(lower, upper, size, name=name, notes=notes)
