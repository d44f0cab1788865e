"""FreeList against a plain model: which block best fit and first fit pick, and what remains."""

from hypothesis import given
from hypothesis import strategies as st

from npumem.alloc.block import Block, FreeList

SPLIT_MIN = 64


def _free_list(holes):
    free = FreeList()
    for start, size in holes:
        free.add(Block(start, size, segment=None))
    return free


@st.composite
def holes_and_requests(draw):
    sizes = draw(st.lists(st.integers(1, 64).map(lambda n: n * 64), min_size=1, max_size=30))
    gaps = draw(st.lists(st.integers(1, 8).map(lambda n: n * 64), min_size=len(sizes), max_size=len(sizes)))
    holes, address = [], 0
    for size, gap in zip(sizes, gaps):
        holes.append((address, size))
        address += size + gap                   # holes never touch, as merged free blocks never do
    requests = draw(st.lists(st.integers(1, 70).map(lambda n: n * 64), max_size=40))
    return holes, requests


@given(holes_and_requests(), st.booleans())
def test_take_matches_the_model(case, first_fit):
    holes, requests = case
    free, model = _free_list(holes), dict(holes)            # model: start -> size
    for size in requests:
        fitting = [(s, start) for start, s in model.items() if s >= size]
        block = free.take(size, SPLIT_MIN, first_fit=first_fit)
        if not fitting:
            assert block is None
            continue
        chosen = min(fitting, key=lambda c: c[1]) if first_fit else min(fitting)
        hole_size, start = chosen
        assert block.start == start
        del model[start]
        if hole_size - size >= SPLIT_MIN:
            assert block.size == size
            model[start + size] = hole_size - size          # the rest stays in the list
        else:
            assert block.size == hole_size
    assert sorted((b.start, b.size) for b in free.at_least(0)) == sorted(model.items())


@given(holes_and_requests(), st.booleans())
def test_fit_names_the_block_take_cuts_and_leaves_the_list_alone(case, first_fit):
    holes, requests = case
    free = _free_list(holes)
    for size in requests:
        before = [(block.start, block.size) for block in free.largest_first()]
        peeked = free.fit(size, first_fit=first_fit)
        assert [(block.start, block.size) for block in free.largest_first()] == before
        peeked_start = None if peeked is None else peeked.start
        block = free.take(size, SPLIT_MIN, first_fit=first_fit)
        assert (None if block is None else block.start) == peeked_start
