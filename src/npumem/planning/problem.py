"""A planning problem: buffers with known lifetimes and sizes, to be placed in one arena.

Buffer `i` of `size[i]` bytes is live on the half-open interval `[lower[i], upper[i])`. The
problems come from CSV files (`id,lower,upper,size`, the format of MiniMalloc's and idealloc's
benchmarks) or from allocation traces, where time is the event number.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..trace.events import TraceEvent


class ProblemFormatError(ValueError):
    """A problem file that cannot be read; names the file, the line and what is wrong."""

    def __init__(self, path: str, line: int | str, reason: str):
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}:{line}: {reason}")

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

    def load(self) -> int:
        """LOAD: the largest sum of sizes live at one moment. No placement is lower."""
        if len(self) == 0:
            return 0
        times = np.concatenate([self.lower, self.upper])
        deltas = np.concatenate([self.size, -self.size])
        # At equal times the frees (negative deltas) come first: lifetimes are half-open.
        order = np.lexsort((deltas, times))
        return int(np.cumsum(deltas[order]).max())


def problem_from_arrays(lower, upper, size, ids=None, name: str = "") -> PlanningProblem:
    lower = np.asarray(lower, dtype=np.int64)
    ids = np.arange(len(lower)) if ids is None else np.asarray(ids)
    return PlanningProblem(ids, lower, np.asarray(upper, dtype=np.int64),
                           np.asarray(size, dtype=np.int64), name)


def read_problem(path: str | os.PathLike) -> PlanningProblem:
    """Read an `id,lower,upper,size` CSV file (a header line is required)."""
    path = os.fspath(path)
    try:
        handle = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise ProblemFormatError(path, 0, f"cannot open: {exc.strerror}") from None
    ids, lower, upper, size = [], [], [], []
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
            if len(row) < 4:
                raise ProblemFormatError(path, line, f"expected 4 fields, got {len(row)}")
            try:
                lo, up, sz = int(row[1]), int(row[2]), int(row[3])
            except ValueError:
                raise ProblemFormatError(path, line, f"lower, upper and size must be integers, "
                                         f"got {row[1:4]}") from None
            if up <= lo or sz < 0:
                raise ProblemFormatError(path, line, f"buffer {row[0]}: needs lower < upper and "
                                         f"size >= 0, got lower={lo}, upper={up}, size={sz}")
            ids.append(row[0].strip())
            lower.append(lo)
            upper.append(up)
            size.append(sz)
    return problem_from_arrays(lower, upper, size, np.array(ids, dtype=object),
                               os.path.basename(path))


def problem_from_trace(events: Iterable[TraceEvent], name: str = "") -> PlanningProblem:
    """Lifetimes from an allocation trace: time is the event number. Blocks still live at the
    end live until the end; frees of blocks allocated before the recording are ignored."""
    start: dict[int, tuple[int, int]] = {}
    lower, upper, size = [], [], []
    clock = 0
    for clock, event in enumerate(events):
        if event.action == "alloc":
            if event.addr in start:                 # its free was not recorded
                begun, nbytes = start.pop(event.addr)
                lower.append(begun), upper.append(clock), size.append(nbytes)
            start[event.addr] = (clock, event.size)
        else:
            entry = start.pop(event.addr, None)
            if entry is not None:
                lower.append(entry[0]), upper.append(clock), size.append(entry[1])
    for begun, nbytes in start.values():
        lower.append(begun), upper.append(clock + 1), size.append(nbytes)
    return problem_from_arrays(lower, upper, size, name=name)


def load_problem(path: str | os.PathLike) -> PlanningProblem:
    """A CSV problem, or the lifetimes of any trace file npumem reads (format auto-detected)."""
    path = os.fspath(path)
    with open(path, "rb") as probe:
        head = probe.read(64)
    if head.lstrip().lower().startswith(b"id,lower,upper,size"):
        return read_problem(path)
    from ..trace import read_trace
    return problem_from_trace(read_trace(path), os.path.basename(path))
