"""Placing a learned step's blocks, so that every later step can reuse their places.

A step repeats, so its blocks' lifetimes are circular: a block allocated late in step k may be
freed early in step k+1. The layout cuts the circle where the fewest planned bytes are live
(`boundary`, usually between steps, after the gradients are dropped).

Inside the pool's address range (or its segments laid end to end, `step_arena.SegmentLine`),
every block goes around the byte ranges the pool's live blocks hold (`taken`), so the step fills
the holes long-lived blocks left; a crossing block's lifetime is two pieces, the end and the
start of the step, and one whose previous instance the pool holds now is pinned to that block's
address (`pinned`), so the two are never counted twice. The greedy orders of
`npumem.planning`, and allocation order (what the pool itself does), choose the placement order.

The result is checked over two consecutive steps, so no two blocks that are ever
live together share a byte, before the pool uses it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..planning import plan, problem_from_arrays
from ..planning.greedy import orders
from ..planning.placement import Beat, place, validate
from ..planning.planner import GREEDY_VARIANTS
from .step_learner import Template

PAGE = 2 << 20            # the arena is device memory in whole 2 MiB pages, like the pool's
TIE_BREAKS = [("size, then breadth", False), ("breadth, then length", False)]


@dataclass
class StepLayout:
    """Where each slot of `template` lives in the arena (offsets from its start)."""

    template: Template
    offsets: list[int]
    height: int              # bytes the blocks reach
    boundary: int            # slot at which a step is cut: the fewest planned bytes live
    algorithm: str
    seconds: float
    line: object = None      # segment pools: the SegmentLine its offsets are on
    provisional: bool = False  # cut between step boundaries: serves until the next one


def lay_out(template: Template, time_limit: float = 5.0, taken=(), pinned: dict[int, int] | None = None,
            boundary: int | None = None) -> StepLayout:
    """Plan `template` (see the module doc), cut at slot `boundary` (one of `cuts`; the
    first by default), around `taken`: (offset, size) ranges held throughout; `pinned` maps
    crossing slots to fixed offsets. Raises PlanError if the result overlaps (a bug)."""
    began = time.perf_counter()
    if boundary is None:
        boundary = cut(template)
    lower, upper = rotated(template, boundary)
    return _lay_out_around(template, lower, upper, np.asarray(template.sizes, dtype=np.int64),
                           boundary, taken, pinned or {}, time_limit, began)


def rotated(template: Template, boundary: int) -> tuple[np.ndarray, np.ndarray]:
    """Lifetimes counted from the cut: [lower, upper), upper past the step's length for a block
    that crosses it."""
    starts = np.asarray(template.starts, dtype=np.int64)
    ends = np.asarray(template.ends, dtype=np.int64)
    lower = (starts - starts[boundary]) % template.length
    return lower, lower + (ends - starts)


def crossing_slots(template: Template, boundary: int) -> list[int]:
    """Slots whose block is live across the cut."""
    _, upper = rotated(template, boundary)
    return np.nonzero(upper > template.length)[0].tolist()


def live_together(starts: np.ndarray, ends: np.ndarray, length: int, slot: int) -> np.ndarray:
    """The slots of a template (`starts`, `ends`, `length`) planned to be live at some moment of
    `slot`'s lifetime (instances of the step before and after included), `slot` left out."""
    low, high = starts[slot], ends[slot]
    meets = np.zeros(len(starts), bool)
    for shift in (-length, 0, length):
        meets |= (starts + shift < high) & (low < ends + shift)
    meets[slot] = False
    return np.nonzero(meets)[0]


def cut(template: Template) -> int:
    """The slot where the step is cut: the fewest planned bytes live (blocks of the previous
    step included)."""
    starts = np.asarray(template.starts, dtype=np.int64)
    ends = np.asarray(template.ends, dtype=np.int64)
    sizes = np.asarray(template.sizes, dtype=np.int64)
    return int(np.argmin(_live_at_allocations(starts, ends, sizes, template.length)))


def cuts(template: Template) -> tuple[int, ...]:
    """The slots where steps are cut: one per step the template holds (its steps are alike)."""
    first, step = cut(template), template.step_slots
    return tuple((first + k * step) % len(template) for k in range(template.repeats))


def _lay_out_around(template, lower, upper, sizes, boundary, taken, pinned, time_limit, began):
    """The best greedy placement around `taken`, with the `pinned` slots where they are, or
    (whichever reserves fewer pages) placed freely while their pool blocks are held until freed."""
    length = template.length
    crossing = upper > length
    pieces = [((lo, hi),) if hi <= length else ((lo, length), (0, hi - length))
              for lo, hi in zip(lower.tolist(), upper.tolist())]
    whole = np.array([[offset, offset + size, -1, 2 * length + 1] for offset, size in taken],
                     dtype=np.int64).reshape(-1, 4)
    fixed = np.array([[offset, offset + sizes[slot], lo, hi] for slot, offset in pinned.items()
                      for lo, hi in pieces[slot]], dtype=np.int64).reshape(-1, 4)
    # A pinned slot's block from the step before lives from the cut to its end in this step.
    leaving = np.array([[offset, offset + sizes[slot], 0, upper[slot] - length]
                        for slot, offset in pinned.items()], dtype=np.int64).reshape(-1, 4)
    problem = problem_from_arrays(np.where(crossing, 0, lower), np.where(crossing, length, upper),
                                  sizes, name="step")
    by_name = orders(problem)
    # in allocation order, first fit is what the pool itself would do
    by_name["time"] = np.argsort(lower, kind="stable")
    # Many blocks share a size or a breadth: other tie-breaks, first fit (each saved a page,
    # on the CPU encoder and cnn_wide recordings)
    length_of = problem.upper - problem.lower
    by_name["size, then breadth"] = np.lexsort((-problem.breadth, -sizes))
    by_name["breadth, then length"] = np.lexsort((-length_of, -problem.breadth))
    deadline = began + time_limit
    best, best_pages, label, best_held = None, None, "", whole
    # Pinning keeps a crossing block where the pool put it, so its two instances are one; that
    # place may suit the rest of the step badly. Moving it costs the room of both instances
    # at the cut. Neither wins everywhere: both are tried.
    variants = [(pinned, np.concatenate([whole, fixed]), "")]
    if pinned:
        variants.append(({}, np.concatenate([whole, leaving]), ", crossing blocks moved"))
    first = np.zeros(len(pieces) + 1, np.int64)
    first[1:] = np.cumsum([len(p) for p in pieces])
    bounds = np.array([bound for piece in pieces for bound in piece], np.int64).reshape(-1, 2)
    for keep, held, moved in variants:
        pinned_top = max((offset + int(sizes[slot]) for slot, offset in keep.items()), default=0)
        for name, best_fit in [("time", False)] + GREEDY_VARIANTS + TIE_BREAKS:
            order = [i for i in by_name[name].tolist() if i not in keep]
            # an order stops once it reaches the best's pages and height: it cannot beat them
            beat = None if best is None else Beat(best_pages[1], best_pages[0], PAGE, pinned_top)
            offsets = place(bounds[:, 0], bounds[:, 1], first, sizes, order, best_fit, held,
                            deadline, beat=beat)
            if offsets is None:
                break
            if offsets is False:
                continue
            for slot, offset in keep.items():
                offsets[slot] = offset
            pages = _pages(offsets, sizes, held)     # what it will reserve, not just how high
            if best is None or pages < best_pages:
                best, best_pages, best_held = offsets, pages, held if moved else whole
                label = f"{name}/{'best' if best_fit else 'first'}-fit around live blocks{moved}"
    if best is None:                       # no time for even one order: above everything taken
        placed = plan(problem, "size", time_limit)
        top = np.concatenate([whole, fixed])[:, 1].max(initial=0)
        best, label = placed.offsets + int(top), "above live blocks"
        for slot, offset in pinned.items():
            best[slot] = offset
    _check_two_steps(lower, upper, sizes, best, length, best_held)
    return StepLayout(template, best.tolist(), int((best + sizes).max()), boundary, label,
                      time.perf_counter() - began)


def _pages(offsets, sizes, held) -> tuple[int, int]:
    """(pages touched by the blocks and the held ranges, height): what a layout reserves."""
    starts = np.concatenate([offsets, held[:, 0]])
    ends = np.concatenate([offsets + sizes, held[:, 1]])
    first, last = starts // PAGE, (ends - 1) // PAGE
    touched = np.zeros(int(last.max(initial=0)) + 2, np.int64)
    np.add.at(touched, first, 1)
    np.add.at(touched, last + 1, -1)
    return int(np.count_nonzero(np.cumsum(touched))), int((offsets + sizes).max(initial=0))


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


def _check_two_steps(lower, upper, sizes, offsets, length: int, held=None) -> None:
    """Validate the layout over two consecutive steps (every lifetime is shorter than a step,
    so a block can only meet blocks of its own step and the next), with the `held` rows
    (start, end, from, until) of the pool's live blocks."""
    held = np.zeros((0, 4), np.int64) if held is None else held
    doubled = problem_from_arrays(
        np.concatenate([lower, lower + length, held[:, 2]]),
        np.concatenate([upper, upper + length, held[:, 3]]),
        np.concatenate([sizes, sizes, held[:, 1] - held[:, 0]]), name="two steps")
    validate(doubled, np.concatenate([offsets, offsets, held[:, 0]]))
