"""`plan(problem, algorithm, time_limit)`: the planner's entry point and its algorithms."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

import numpy as np

from .greedy import orders
from .placement import Plan, place_in_order, validate
from .problem import PlanningProblem
from .search import PREORDERS, SearchAborted, SkylineSearch


ALGORITHMS = {
    "size": "greedy by size: biggest buffer first, each in the lowest gap that fits",
    "breadth": "greedy by breadth: buffers live at the busiest moments first",
    "best": "the best of the greedy orders (size, breadth, length, area), first and best fit",
    "search": "the best greedy plan, then a depth-first search for lower heights until the "
              "time limit (the default)",
}

Progress = Callable[[str], None]


def plan(problem: PlanningProblem, algorithm: str = "search", time_limit: float = 60.0,
         progress: Progress | None = None) -> Plan:
    """Place every buffer of `problem`; the result is validated before it is returned."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    if time_limit <= 0:
        raise ValueError(f"time limit must be positive, got {time_limit}")
    start = time.perf_counter()
    say = progress or (lambda message: None)
    if algorithm in ("size", "breadth"):
        offsets = place_in_order(problem, orders(problem)[algorithm])
        result = Plan(problem, offsets, algorithm)
    else:
        result = _best_greedy(problem, say)
        if algorithm == "search":
            result = _improve(problem, result, start + time_limit, say)
    result.seconds = time.perf_counter() - start
    validate(problem, result.offsets)
    return result


def _best_greedy(problem: PlanningProblem, say: Progress) -> Plan:
    best = None
    for name, order in orders(problem).items():
        for best_fit in (False, True):
            label = f"{name}/{'best' if best_fit else 'first'}-fit"
            candidate = Plan(problem, place_in_order(problem, order, best_fit), f"best ({label})")
            if best is None or candidate.height < best.height:
                best = candidate
    say(f"greedy: {best.algorithm} height {best.height} ({best.height_over_load:.4f} x load)")
    return best


def _improve(problem: PlanningProblem, best: Plan, deadline: float, say: Progress) -> Plan:
    """Lower the best height found so far towards LOAD with short randomized searches.

    Each attempt asks for a placement within `best height - step`, for a short time budget. The
    search's running time is heavy-tailed (a solution within a few thousand nodes, or none in a
    million), so a failure proves nothing: it halves the step, and once the step is down to the
    tolerance the budget doubles and the step starts wide again, so every capacity gets another,
    longer chance. Only a search that finishes without a placement proves a capacity
    infeasible; that raises the floor. This is a heuristic, not a proof of optimality.
    """
    floor = problem.load()          # no placement is lower than this
    if best.height <= floor or len(problem) == 0:
        return best
    search = SkylineSearch(problem)
    rng = np.random.default_rng(0)
    tolerance = max(1, floor // 10_000)
    budget = max(0.5, (deadline - time.perf_counter()) / 10)
    step = max(tolerance, (best.height - floor) // 4)
    while best.height - floor > tolerance and time.perf_counter() < deadline:
        capacity = max(floor, best.height - step)
        stop = min(time.perf_counter() + budget, deadline)
        try:
            offsets = _run_deep(lambda: _attempt(search, rng, capacity, stop))
        except CapacityInfeasible:
            floor = capacity + 1
            say(f"search: no placement within {capacity} (proven)")
            continue
        if offsets is not None:
            best = Plan(problem, offsets, "search")
            say(f"search: height {best.height} ({best.height_over_load:.4f} x load)")
        elif step > tolerance:
            step = max(tolerance, step // 2)
        else:
            budget *= 2
            step = max(tolerance, (best.height - floor) // 4)
    return best


class CapacityInfeasible(Exception):
    """A search finished without a placement: nothing fits within the capacity."""


def _attempt(search: SkylineSearch, rng: np.random.Generator, capacity: int,
             deadline: float) -> np.ndarray | None:
    """Randomized restarts until a placement within `capacity` turns up (its offsets) or time
    runs out (None); raises CapacityInfeasible if a search proves there is none."""
    node_limit = 5 * len(search.problem)
    restarts = 0
    while time.perf_counter() < deadline:
        rank = search.rank(PREORDERS[rng.integers(len(PREORDERS))], rng)
        try:
            offsets = search.solve(capacity, rank, node_limit, deadline)
            if offsets is None:
                raise CapacityInfeasible(capacity)
            return offsets
        except SearchAborted:
            restarts += 1
            if restarts % 100 == 0:
                node_limit *= 2
    return None


def _run_deep(work):
    """Run `work()` in a thread with a large stack: the search recurses once per buffer."""
    result, failure = [], []

    def target():
        try:
            result.append(work())
        except BaseException as exc:        # re-raised in the caller's thread
            failure.append(exc)

    previous_stack = threading.stack_size(256 * 1024 * 1024)
    previous_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous_limit, 1_000_000))
    try:
        worker = threading.Thread(target=target, name="npumem-planner")
        worker.start()
        worker.join()
    finally:
        threading.stack_size(previous_stack)
        sys.setrecursionlimit(previous_limit)
    if failure:
        raise failure[0]
    return result[0]
