"""Placing a learned step's blocks in one arena, so that every later step can reuse it.

A step repeats, so its blocks' lifetimes are circular: a block allocated late in step k may be
freed early in step k+1. The layout cuts the circle where the fewest planned bytes are live
(`boundary`, usually between steps, after the gradients are dropped). Blocks that still cross
the cut get their own places at the bottom of the arena; the rest are placed above them by
`npumem.planning`, over the step's time. The result is checked over two consecutive steps, so no
two blocks that are ever live together share a byte, before the pool uses it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..planning import Plan, plan, problem_from_arrays
from ..planning.placement import validate
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


def lay_out(template: Template, algorithm: str = "best", time_limit: float = 5.0) -> StepLayout:
    """Plan `template` (see the module doc); raises PlanError if the result overlaps (a bug)."""
    began = time.perf_counter()
    length = template.length
    starts = np.asarray(template.starts, dtype=np.int64)
    ends = np.asarray(template.ends, dtype=np.int64)
    sizes = np.asarray(template.sizes, dtype=np.int64)
    boundary = int(np.argmin(_live_at_allocations(starts, ends, sizes, length)))
    lower = (starts - starts[boundary]) % length
    upper = lower + (ends - starts)
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


def _check_two_steps(lower, upper, sizes, offsets, length: int) -> None:
    """Validate the layout over two consecutive steps (every lifetime is shorter than a step,
    so a block can only meet blocks of its own step and the next)."""
    doubled = problem_from_arrays(np.concatenate([lower, lower + length]),
                                  np.concatenate([upper, upper + length]),
                                  np.concatenate([sizes, sizes]), name="two steps")
    validate(doubled, np.concatenate([offsets, offsets]))
