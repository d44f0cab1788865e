"""The planner's search in C (planning/_search.c) against the Python search it mirrors: the
same nodes in the same order, so the same answer, the same node count and the same stop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from npumem.planning import problem_from_arrays
from npumem.planning import search as search_module
from npumem.planning.search import PREORDERS, SearchAborted, SkylineSearch

pytestmark = pytest.mark.skipif(search_module.native is None, reason="the C search is not built")

problems = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 15), st.integers(0, 100)),
                    min_size=1, max_size=24).map(
    lambda rows: problem_from_arrays([r[0] for r in rows], [r[0] + r[1] for r in rows],
                                     [r[2] for r in rows]))


def outcome(problem, use_native: bool, capacity: int, preorder: str, seed: int, node_limit: int,
            cancelled: bool = False, reranked: bool = False):
    search = SkylineSearch(problem, use_native=use_native)
    rank = search.rank(preorder, np.random.default_rng(seed) if seed else None)
    search.cancelled = cancelled
    try:
        offsets = search.solve(capacity, rank, node_limit, float("inf"),
                               preorder if reranked else None)
    except SearchAborted:
        return "aborted", search.nodes
    return (None if offsets is None else offsets.tolist()), search.nodes


@settings(max_examples=400, deadline=None)
@given(problems, st.integers(0, 60), st.sampled_from(PREORDERS), st.integers(0, 3),
       st.sampled_from([10, 200, 100_000]), st.booleans(), st.booleans())
@example(problem_from_arrays([1, 2, 2, 5, 7, 7, 1, 4], [2, 6, 5, 9, 11, 11, 3, 6],
                             [70, 40, 60, 70, 50, 60, 100, 90]), 5, "TAW", 0, 100_000, True, True)
def test_the_same_search_node_for_node(problem, extra, preorder, seed, node_limit, dense,
                                       reranked):
    capacity = problem.load() + extra
    with pytest.MonkeyPatch.context() as patch:
        if not dense:                 # without the stronger floor test, as on large problems
            patch.setattr(search_module, "DENSE_LIMIT", -1)
        native = outcome(problem, True, capacity, preorder, seed, node_limit, reranked=reranked)
        python = outcome(problem, False, capacity, preorder, seed, node_limit, reranked=reranked)
    assert native == python
    offsets = native[0]
    if isinstance(offsets, list):               # a placement: within the capacity, no overlap
        tops = np.array(offsets) + problem.size
        assert tops.max(initial=0) <= capacity
        for i in range(len(problem)):
            for j in range(i):
                live = problem.lower[i] < problem.upper[j] and problem.lower[j] < problem.upper[i]
                if live and problem.size[i] and problem.size[j]:
                    assert tops[i] <= offsets[j] or tops[j] <= offsets[i]


def test_cancelled_before_it_starts_stops_where_the_python_search_does():
    rows = np.random.default_rng(3).integers(1, 50, size=(200, 3))    # (200 nodes at least)
    problem = problem_from_arrays(rows[:, 0], rows[:, 0] + rows[:, 1], rows[:, 2])
    capacity = problem.load()
    assert outcome(problem, True, capacity, "TWA", 0, 10**9, cancelled=True) == \
        outcome(problem, False, capacity, "TWA", 0, 10**9, cancelled=True) == ("aborted", 64)


def test_arrays_that_do_not_fit_are_refused():
    search = SkylineSearch(problem_from_arrays([0, 1], [2, 3], [4, 5]))
    with pytest.raises(ValueError, match="rank"):
        search_module.native.solve(search.first, search.last, search.size, search.lower,
                                   search.upper, np.zeros(3, np.int64), search.by_first,
                                   search.starting, True, 10, 100, float("inf"),
                                   search._cancel)
    with pytest.raises(ValueError, match="out of range"):
        search_module.native.solve(search.first, search.last, search.size, search.lower,
                                   search.upper, np.array([0, 7]), search.by_first,
                                   search.starting, True, 10, 100, float("inf"),
                                   search._cancel)


@pytest.mark.parametrize("use_native", [True, False])
def test_a_buffer_of_no_bytes_is_placed(use_native):
    # It was never a candidate when its top (its offset) was the lowest: a capacity that
    # holds everything was "proven" infeasible.
    problem = problem_from_arrays([0, 1], [1, 2], [1, 0])
    search = SkylineSearch(problem, use_native=use_native)
    assert search.solve(problem.load(), search.rank("TAW"), 1000, float("inf")).tolist() == [0, 0]


def test_ranking_each_part_again_changes_the_search_and_keeps_it_equal():
    """Parts that split off are ranked again (MiniMalloc's order by current totals): on some
    problem that visits other nodes than the fixed rank, in both searches alike."""
    rng = np.random.default_rng(11)
    differs = 0
    for _ in range(60):
        rows = rng.integers(0, 100, size=(40, 3))
        problem = problem_from_arrays(rows[:, 0], rows[:, 0] + 1 + rows[:, 1] % 12, rows[:, 2] + 1)
        capacity = problem.load() + int(rng.integers(0, 10))
        fixed = outcome(problem, True, capacity, "TWA", 0, 100_000)
        again = outcome(problem, True, capacity, "TWA", 0, 100_000, reranked=True)
        assert again == outcome(problem, False, capacity, "TWA", 0, 100_000, reranked=True)
        differs += fixed != again
    assert differs


def test_a_search_deeper_than_its_thread_stack_holds_is_aborted_not_a_crash():
    """A level of recursion per buffer: on a small stack, a long chain of buffers stops the
    search (SearchAborted, as a node limit would) instead of overflowing it."""
    import threading

    n = 5_000                           # each buffer overlaps the next: one part, 5,000 deep
    problem = problem_from_arrays(list(range(n)), [i + 2 for i in range(n)], [1] * n)
    outcome_of = {}

    def run():
        search = SkylineSearch(problem)
        try:
            outcome_of["offsets"] = search.solve(2, search.rank("TWA"), 10**9, float("inf"))
        except SearchAborted:
            outcome_of["aborted"] = True

    previous = threading.stack_size(512 * 1024)
    try:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    finally:
        threading.stack_size(previous)
    assert outcome_of == {"aborted": True}
    search = SkylineSearch(problem)         # on a stack with room (the main thread's 8 MiB)
    assert search.solve(2, search.rank("TWA"), 10**9, float("inf")) is not None
