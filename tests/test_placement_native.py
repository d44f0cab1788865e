"""The native greedy placement (planning/_placement.c) against its statement in Python
(planning.placement.place, native=False): the same offsets for any buffers, pieces, held rows,
order and fit, and both valid placements."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumem.planning import placement
from npumem.planning.problem import problem_from_arrays

pytestmark = pytest.mark.skipif(placement._native is None, reason="the extension is not built")


@st.composite
def layouts(draw):
    n = draw(st.integers(0, 30))
    pieces = [draw(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25)), min_size=1,
                            max_size=2)) for _ in range(n)]
    scale = draw(st.sampled_from([1, 97]))    # time in few buckets, or across many
    lo = scale * np.array([a for p in pieces for a, _ in p], np.int64)
    hi = lo + scale * np.array([b for p in pieces for _, b in p], np.int64)
    first = np.r_[0, np.cumsum([len(p) for p in pieces])].astype(np.int64)
    sizes = np.array(draw(st.lists(st.just(0) | st.integers(1, 5000), min_size=n, max_size=n)),
                     np.int64)                 # (empty buffers: where ties in start matter)
    order = np.array(draw(st.permutations(list(range(n)))), np.int64)
    held = np.array(draw(st.lists(st.tuples(st.integers(0, 9000), st.integers(0, 3000),
                                            st.integers(-1, 40), st.integers(0, 90)),
                                  max_size=6)), np.int64).reshape(-1, 4)
    held[:, 1] += held[:, 0]
    return lo, hi, first, sizes, order, held


@settings(max_examples=400, deadline=None)
@given(layouts(), st.booleans())
def test_native_placement_is_the_python_statement(layout, best_fit):
    lo, hi, first, sizes, order, held = layout
    expected = placement.place(lo, hi, first, sizes, order, best_fit, held, native=False)
    got = placement.place(lo, hi, first, sizes, order, best_fit, held, native=True)
    assert got.tolist() == expected.tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 20), st.integers(1, 4096)),
                max_size=40), st.booleans())
def test_native_placement_is_valid(buffers, best_fit):
    lower = np.array([b[0] for b in buffers], np.int64)
    problem = problem_from_arrays(lower, lower + [b[1] for b in buffers],
                                  np.array([b[2] for b in buffers], np.int64))
    offsets = placement.place_in_order(problem, np.arange(len(problem))[::-1], best_fit)
    placement.validate(problem, offsets)


def test_past_its_time_the_native_placement_gives_up_and_bad_arrays_are_refused():
    one = np.zeros(1, np.int64)
    assert placement.place(one, one + 1, [0, 1], one, one, deadline=0.0) is None
    with pytest.raises(ValueError, match="names buffer 5 that is not one"):
        placement._native.place(one, one + 1, np.array([0, 1]), one, np.array([5]), False,
                                np.zeros(0, np.int64), 1.0)
    with pytest.raises(ValueError, match="inconsistent lengths"):
        placement._native.place(one, one, np.array([0, 2]), one, one, False,
                                np.zeros(0, np.int64), 1.0)


def test_rows_that_start_together_keep_their_order():
    """An empty row at the start of a full one: in row order, no gap opens between them."""
    held = np.array([[10, 20, 0, 10], [10, 10, 0, 10]], np.int64)
    args = (np.array([0]), np.array([10]), np.array([0, 1]), np.array([0]), np.array([0]), True,
            held)
    assert placement.place(*args, native=False).tolist() == [0]
    assert placement.place(*args, native=True).tolist() == [0]


@pytest.mark.parametrize("order", [[0, 0], [0, 1, 0], [2], [-1]])
def test_an_order_naming_a_buffer_twice_or_none_is_refused(order):
    one = np.zeros(2, np.int64)
    for native in (False, True):
        with pytest.raises(ValueError, match="at most once"):
            placement.place(one, one + 1, [0, 1, 2], one + 8, order, native=native)
    with pytest.raises(ValueError, match="at most once; it names (buffer .* (twice|that is not one)|3)"):
        placement._native.place(one, one + 1, np.array([0, 1, 2]), one + 8,
                                np.array(order, np.int64), False, np.zeros(0, np.int64), 1.0)


def _pages_and_height(offsets, sizes, held, page):
    """What a step layout compares (step_plan._pages's rule): pages touched by the buffers and
    the held rows, then the buffers' top."""
    spans = [(int(o), int(o + s)) for o, s in zip(offsets, sizes)] + \
        [(int(a), int(b)) for a, b in held[:, :2]]
    touched = {p for start, end in spans for p in range(start // page, (end - 1) // page + 1)}
    return len(touched), int((offsets + sizes).max(initial=0))


@settings(max_examples=400, deadline=None)
@given(layouts(), st.booleans(), st.integers(0, 40), st.integers(0, 30000),
       st.sampled_from([1, 64, 4096]), st.booleans(), st.integers(0, 6000))
def test_a_placement_stops_when_it_cannot_beat_another_and_only_then(
        layout, best_fit, pages, height, page, by_pages, before):
    """With a placement to beat, both statements stop (False) exactly when the whole placement
    would not be lower, (pages, height) in that order, or height alone; else the same offsets."""
    lo, hi, first, sizes, order, held = layout
    beat = placement.Beat(height, pages if by_pages else None, page, before)
    whole = placement.place(lo, hi, first, sizes, order, best_fit, held, native=False)
    placed = np.isin(np.arange(len(sizes)), order)
    got_pages, got_height = _pages_and_height(whole[placed], sizes[placed], held, page)
    got_height = max(got_height, before)
    lower = (got_pages, got_height) < (pages, height) if by_pages else got_height < height
    for native in (False, True):
        result = placement.place(lo, hi, first, sizes, order, best_fit, held, native=native,
                                 beat=beat)
        if lower:
            assert result is not False and result.tolist() == whole.tolist()
        else:
            assert result is False
