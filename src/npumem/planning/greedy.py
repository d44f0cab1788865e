"""Greedy placements: sort the buffers, then place each in the lowest gap that fits."""

from __future__ import annotations

import numpy as np

from .problem import PlanningProblem


def breadth(problem: PlanningProblem) -> np.ndarray:
    """For each buffer, the largest total size live at any moment of its lifetime."""
    points = np.unique(np.concatenate([problem.lower, problem.upper]))
    first = np.searchsorted(points, problem.lower)
    last = np.searchsorted(points, problem.upper)
    delta = np.zeros(len(points), np.int64)
    np.add.at(delta, first, problem.size)
    np.add.at(delta, last, -problem.size)
    live = np.cumsum(delta)
    return np.array([live[a:b].max() for a, b in zip(first, last)], dtype=np.int64)


def orders(problem: PlanningProblem) -> dict[str, np.ndarray]:
    """The placement orders the greedy algorithms use (np.lexsort: last key is the primary)."""
    length = problem.upper - problem.lower
    size = problem.size
    return {
        # TFLite's and MindSpore's classic: biggest first, longer lifetime breaks ties.
        "size": np.lexsort((-length, -size)),
        # TFLite's greedy by breadth: buffers live at the busiest moments first.
        "breadth": np.lexsort((-size, -breadth(problem))),
        "length": np.lexsort((-size, -length)),
        "area": np.argsort(-(size * length), kind="stable"),
    }

