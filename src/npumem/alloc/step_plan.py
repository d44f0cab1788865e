"""Placing a learned step's blocks in one arena, so that every later step can reuse it.

A step repeats, so its blocks' lifetimes are circular: a block allocated late in step k may be
freed early in step k+1. The layout cuts the circle where the fewest planned bytes are live
(`boundary`, usually between steps, after the gradients are dropped).

In its own arena, blocks that still cross the cut get their own places at the bottom and the
rest are placed above them by `npumem.planning`. Inside the pool's address range (`taken`: the
byte ranges its live blocks hold), crossing blocks count as live for the whole step and every
block goes around the taken ranges, so the step fills the holes long-lived blocks left between
them; the greedy orders of `npumem.planning` do that placement. Either way the result is checked
over two consecutive steps, so no two blocks that are ever live together share a byte, before
the pool uses it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..planning import Plan, plan, problem_from_arrays
from ..planning.greedy import orders
from ..planning.placement import place_in_order, validate
from ..planning.planner import GREEDY_VARIANTS
from .step_learner import Template

PAGE = 2 << 20            # the arena is device memory in whole 2 MiB pages, like the pool's


@dataclass
class StepLayout:
    """Where each slot of `template` lives in the arena (offsets from its start)."""

    template: Template
    offsets: list[int]
    arena_bytes: int         # whole pages
    height: int              # bytes the blocks reach
    boundary: int            # slot at which a step is cut: the fewest planned bytes live
    crossing_bytes: int      # bytes of the blocks live across the cut (the bottom of the arena)
    load: int                # the most bytes live at once: no layout is lower
    algorithm: str
    seconds: float


def lay_out(template: Template, algorithm: str = "best", time_limit: float = 5.0,
            taken: list[tuple[int, int]] | None = None) -> StepLayout:
    """Plan `template` (see the module doc); `taken`: (offset, size) ranges held throughout.
    Raises PlanError if the result overlaps (a bug)."""
    began = time.perf_counter()
    length = template.length
    starts = np.asarray(template.starts, dtype=np.int64)
    ends = np.asarray(template.ends, dtype=np.int64)
    sizes = np.asarray(template.sizes, dtype=np.int64)
    boundary = cut(template)
    lower = (starts - starts[boundary]) % length
    upper = lower + (ends - starts)
    if taken:
        return _lay_out_around(template, lower, upper, sizes, boundary, taken, time_limit, began)
    crossing = upper > length
    offsets = np.zeros(len(sizes), dtype=np.int64)
    offsets[crossing] = np.cumsum(sizes[crossing]) - sizes[crossing]
    bottom = int(sizes[crossing].sum())
    inside = ~crossing
    placed = Plan(problem_from_arrays([], [], []), np.zeros(0, np.int64), "none")
    if inside.any():
        problem = problem_from_arrays(lower[inside], upper[inside], sizes[inside], name="step")
        placed = plan(problem, algorithm, time_limit)
        offsets[inside] = placed.offsets + bottom
    _check_two_steps(lower, upper, sizes, offsets, length)
    height = int((offsets + sizes).max())
    load = int(_live_at_allocations(lower, upper, sizes, length).max())
    return StepLayout(template, offsets.tolist(), -(-height // PAGE) * PAGE, height, boundary,
                      bottom, load, placed.algorithm, time.perf_counter() - began)


def cut(template: Template) -> int:
    """The slot where the step is cut: the fewest planned bytes live (blocks of the previous
    step included)."""
    starts = np.asarray(template.starts, dtype=np.int64)
    ends = np.asarray(template.ends, dtype=np.int64)
    sizes = np.asarray(template.sizes, dtype=np.int64)
    return int(np.argmin(_live_at_allocations(starts, ends, sizes, template.length)))


def _lay_out_around(template, lower, upper, sizes, boundary, taken, time_limit, began):
    """The best greedy placement around `taken` (crossing blocks live the whole step)."""
    length = template.length
    crossing = upper > length
    problem = problem_from_arrays(np.where(crossing, 0, lower), np.where(crossing, length, upper),
                                  sizes, name="step")
    starts = np.array([offset for offset, _ in taken], dtype=np.int64)
    ends = starts + np.array([size for _, size in taken], dtype=np.int64)
    deadline = began + time_limit
    best, label = None, ""
    by_name = orders(problem)
    # in allocation order, first fit is what the pool itself would do: never worse than it
    by_name["time"] = np.argsort(lower, kind="stable")
    for name, best_fit in [("time", False)] + GREEDY_VARIANTS:
        offsets = place_in_order(problem, by_name[name], best_fit, deadline, (starts, ends))
        if offsets is None:
            break
        if best is None or (offsets + sizes).max() < (best + sizes).max():
            best, label = offsets, f"{name}/{'best' if best_fit else 'first'}-fit around live blocks"
    if best is None:                       # no time for even one order: above everything taken
        placed = plan(problem, "size", time_limit)
        best, label = placed.offsets + (int(ends.max()) if len(ends) else 0), "above live blocks"
    _check_two_steps(lower, upper, sizes, best, length, (starts, ends))
    height = int((best + sizes).max())
    load = int(_live_at_allocations(lower, upper, sizes, length).max())
    return StepLayout(template, best.tolist(), height, height, boundary,
                      int(sizes[crossing].sum()), load, label, time.perf_counter() - began)


def _live_at_allocations(starts, ends, sizes, length: int) -> np.ndarray:
    """Bytes live (in the steady state, blocks from the previous step included) just after
    each slot's allocation."""
    change = np.zeros(length + 1, dtype=np.int64)
    np.add.at(change, starts, sizes)
    np.add.at(change, np.minimum(ends, length), -sizes)
    wraps = ends > length
    np.add.at(change, np.zeros(int(wraps.sum()), dtype=np.int64), sizes[wraps])
    np.add.at(change, ends[wraps] - length, -sizes[wraps])
    return np.cumsum(change)[starts]


def _check_two_steps(lower, upper, sizes, offsets, length: int, taken=None) -> None:
    """Validate the layout over two consecutive steps (every lifetime is shorter than a step,
    so a block can only meet blocks of its own step and the next), with the `taken` ranges
    (starts, ends) held throughout."""
    starts, ends = taken if taken is not None else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    held = len(starts)
    doubled = problem_from_arrays(
        np.concatenate([lower, lower + length, np.full(held, -1)]),
        np.concatenate([upper, upper + length, np.full(held, 2 * length + 1)]),
        np.concatenate([sizes, sizes, ends - starts]), name="two steps")
    validate(doubled, np.concatenate([offsets, offsets, starts]))
