"""Greedy orders: which buffer to place first (placement itself is `place_in_order`)."""

from __future__ import annotations

import numpy as np

from .problem import PlanningProblem


def orders(problem: PlanningProblem) -> dict[str, np.ndarray]:
    """The placement orders the greedy algorithms use (np.lexsort: last key is the primary)."""
    length = problem.upper - problem.lower
    size = problem.size
    return {
        # TFLite's and MindSpore's classic: biggest first, longer lifetime breaks ties.
        "size": np.lexsort((-length, -size)),
        # TFLite's greedy by breadth: buffers live at the busiest moments first.
        "breadth": np.lexsort((-size, -problem.breadth)),
        "length": np.lexsort((-size, -length)),
        "area": np.argsort(-(size * length), kind="stable"),
    }

