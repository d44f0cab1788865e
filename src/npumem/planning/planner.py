"""`plan(problem, algorithm, time_limit)`: the planner's entry point and its algorithms."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

import numpy as np

from .greedy import orders
from .placement import Beat, Plan, place_in_order, validate
from .problem import PlanningProblem
from .search import FIRST_ORDERS, PREORDERS, SearchAborted, SkylineSearch
from .sweep import place_by_time


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
    """Place every buffer of `problem`; the result is validated before it is returned.

    A first plan comes from a sweep over time, in O(n log n), whatever the size; the greedy
    orders (O(n^2)) and the search then use what is left of `time_limit`, and a greedy order
    that cannot finish in time is dropped. Ctrl-C (KeyboardInterrupt) ends the work at once and
    returns the best plan so far, with `interrupted` set."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    if not time_limit > 0:                     # (nan too)
        raise ValueError(f"time limit must be positive, got {time_limit}")
    start = time.perf_counter()
    deadline = start + time_limit
    say = progress or (lambda message: None)
    result = Plan(problem, place_by_time(problem), "time sweep")
    try:
        say(f"time sweep: height {result.height} ({result.height_over_load:.4f} x load)")
        if algorithm in ("size", "breadth"):           # that greedy order itself, if it finishes
            offsets = place_in_order(problem, orders(problem)[algorithm], False, deadline)
            if offsets is None:
                result.notes.append(f"greedy {algorithm} stopped at the time limit; the time "
                                    "sweep's plan is kept")
                say(f"greedy {algorithm}: stopped at the time limit; keeping the time sweep")
            else:
                result = Plan(problem, offsets, algorithm)
        else:
            result = _greedy(problem, result, deadline, say)
            if algorithm == "search":
                result = _improve(problem, result, deadline, say)
    except _Interrupted as stop:
        result = stop.best
        result.interrupted = True
    except KeyboardInterrupt:
        result.interrupted = True
    result.seconds = time.perf_counter() - start
    validate(problem, result.offsets)
    return result


# Greedy orders and fits, in the order they are tried (the classic one first).
GREEDY_VARIANTS = [(name, best_fit) for name in ("size", "breadth", "length", "area")
                   for best_fit in (False, True)]


def _greedy(problem: PlanningProblem, best: Plan, deadline: float, say: Progress) -> Plan:
    """The lowest of `best` and the greedy plans that finish before `deadline`."""
    try:
        by_name = orders(problem)
        for name, best_fit in GREEDY_VARIANTS:
            label = f"{name}/{'best' if best_fit else 'first'}-fit"
            # (an order stops once it reaches the best height: it could not be lower)
            offsets = place_in_order(problem, by_name[name], best_fit, deadline, Beat(best.height))
            if offsets is None:
                best.notes.append(f"greedy {label} and the orders after it stopped at the time "
                                  f"limit; {best.algorithm}'s plan is kept")
                say(f"greedy {label}: stopped at the time limit; keeping {best.algorithm}")
                break
            if offsets is False:
                continue
            candidate = Plan(problem, offsets, f"best ({label})")
            if candidate.height < best.height:
                best = candidate
                say(f"greedy {label}: height {best.height} ({best.height_over_load:.4f} x load)")
    except KeyboardInterrupt:
        raise _Interrupted(best) from None
    return best


class _Interrupted(Exception):
    """Ctrl-C during the search, carrying the best plan found before it."""

    def __init__(self, best: Plan):
        super().__init__("interrupted")
        self.best = best


def _improve(problem: PlanningProblem, best: Plan, deadline: float, say: Progress) -> Plan:
    """Lower the best height found so far towards LOAD with short randomized searches.

    The first attempt asks for LOAD itself, for a quarter of the time (optimal where it is
    found). Each later one asks for `best height - step`, for a short time budget. The
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
    left = deadline - time.perf_counter()
    budget = max(0.5, left / 10)
    step = max(tolerance, (best.height - floor) // 4)
    first = True
    try:
        while best.height - floor > tolerance and time.perf_counter() < deadline:
            capacity = floor if first else max(floor, best.height - step)
            stop = min(time.perf_counter() + (left / 4 if first else budget), deadline)
            rounds, first = first, False
            try:
                offsets = _run_deep(lambda: _attempt(search, rng, capacity, stop, rounds),
                                    search)
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
    except KeyboardInterrupt:
        raise _Interrupted(best) from None
    return best


class CapacityInfeasible(Exception):
    """A search finished without a placement: nothing fits within the capacity."""


def _attempt(search: SkylineSearch, rng: np.random.Generator, capacity: int,
             deadline: float, rounds: bool = False) -> np.ndarray | None:
    """Restarts until a placement within `capacity` turns up (its offsets) or time runs out
    (None); raises CapacityInfeasible if a search proves there is none. The search's time is
    heavy-tailed (an order finds a placement within a few thousand nodes, or none in a
    million). Restarts take an order at random, its keys jittered, under a node limit that
    doubles every 100 restarts; with `rounds`, each round tries MiniMalloc's three orders as
    they are (each part that splits off ranked again, as MiniMalloc does) and one other at
    random, the limit doubling every round (better for one long attempt at a capacity)."""
    node_limit = (2 if rounds else 5) * len(search.problem)
    restarts = 0
    while time.perf_counter() < deadline and not search.cancelled:
        if rounds:      # (MiniMalloc's orders rank each part that splits off again)
            tries = [(search.rank(order), order) for order in PREORDERS[:FIRST_ORDERS]]
            tries.append((search.rank(PREORDERS[rng.integers(FIRST_ORDERS, len(PREORDERS))],
                                      rng), None))
        else:
            tries = [(search.rank(PREORDERS[rng.integers(len(PREORDERS))], rng), None)]
        for rank, preorder in tries:
            try:
                offsets = search.solve(capacity, rank, node_limit, deadline, preorder)
            except SearchAborted:
                if time.perf_counter() >= deadline or search.cancelled:
                    return None
                continue
            if offsets is None:
                raise CapacityInfeasible(capacity)
            return offsets
        restarts += 1
        if rounds or restarts % 100 == 0:
            node_limit *= 2
    return None


def _run_deep(work, search: SkylineSearch):
    """Run `work()` in a thread with a large stack: the search recurses once per buffer. On
    Ctrl-C the search is told to stop, and the interrupt goes on once it has: never before, as
    a search left running recurses past the recursion limit restored here (a fatal error, not
    an exception). Wherever the interrupt lands (Thread.start included), the thread's own
    events say whether it runs: after an interrupted join, Python 3.11 takes a running thread
    for stopped."""
    result, failure = [], []
    began, done = threading.Event(), threading.Event()

    def target():
        began.set()
        try:
            result.append(work())
        except BaseException as exc:        # re-raised in the caller's thread
            failure.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=target, name="npumem-planner")
    previous_stack = threading.stack_size(256 * 1024 * 1024)
    previous_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous_limit, 1_000_000))
    interrupt = None
    try:
        worker.start()
        done.wait()
    except KeyboardInterrupt as exc:
        interrupt = exc
    finally:
        # (a thread that was never launched never begins: a second is long enough to know)
        while not done.is_set() and (began.is_set() or began.wait(1.0)):
            search.cancelled, search.deadline = True, float("-inf")
            try:
                done.wait()
            except KeyboardInterrupt as exc:
                interrupt = exc
        threading.stack_size(previous_stack)
        sys.setrecursionlimit(previous_limit)
    if interrupt is not None:
        raise interrupt
    if failure:
        raise failure[0]
    return result[0]
