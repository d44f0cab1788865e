"""FreeList against a plain model: which block best fit and first fit pick, and what remains;
and the C FreeList against the Python one it replaced."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npumem.alloc.block import Block, FreeList

from .free_list_oracle import OracleFreeList

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


def _chain(holes_and_live, segment):
    """Blocks laid end to end from (size, free) pairs, linked in address order."""
    blocks, start = [], 0
    for size, free in holes_and_live:
        block = Block(start, size, segment, blocks[-1] if blocks else None)
        if blocks:
            blocks[-1].next = block
        block.allocated = not free
        blocks.append(block)
        start += size
    return blocks


def _state(free, first):
    chain, block = [], first
    while block is not None:
        chain.append((block.start, block.size, block.allocated))
        block = block.next
    listed = [(block.start, block.size) for block in free._blocks]
    return chain, listed, free._keys, free._starts


@given(st.lists(st.tuples(st.integers(1, 40).map(lambda n: n * 64), st.booleans()), min_size=1,
                max_size=20),
       st.lists(st.tuples(st.booleans(), st.integers(1, 45).map(lambda n: n * 64),
                          st.integers(0, 10**6), st.booleans()), max_size=60),
       st.integers(0, 3).map(lambda n: None if n == 0 else n * 1024))
def test_the_c_free_list_does_what_the_python_one_did(layout, steps, below):
    """The C FreeList against the Python one it replaced (tests/free_list_oracle.py): the same
    takes and frees on two copies of a chain of blocks leave the same chains, lists and keys,
    and hand out blocks at the same addresses."""
    merged = []                 # neighbouring free blocks would be merged in a real pool
    for size, free in layout:
        if free and merged and merged[-1][1]:
            merged[-1] = (merged[-1][0] + size, True)
        else:
            merged.append((size, free))
    lists, firsts, live = [], [], []
    for kind in (FreeList, OracleFreeList):
        blocks = _chain(merged, segment=None)
        free = kind()
        for block in blocks:
            if not block.allocated:
                free.add(block)
        lists.append(free)
        firsts.append(blocks[0])
        live.append([block for block in blocks if block.allocated])
    for take, size, pick, first_fit in steps:
        if take or not live[0]:
            got = [free.take(size, SPLIT_MIN, below, first_fit) for free in lists]
            assert [(b.start, b.size) if b else None for b in got] == \
                   [(b.start, b.size) if b else None for b in got[::-1]]
            for mine, block in zip(live, got):
                if block is not None:
                    block.allocated = True
                    mine.append(block)
        else:
            index = pick % len(live[0])
            for free, mine in zip(lists, live):
                block = mine.pop(index)
                block.allocated = False
                free.merge_and_add(block)
        assert _state(lists[0], firsts[0]) == _state(lists[1], firsts[1])
        assert lists[0].largest() == lists[1].largest()
        assert [(b.start, b.size) for b in lists[0].at_least(size)] == \
               [(b.start, b.size) for b in lists[1].at_least(size)]


def test_the_c_free_list_refuses_what_is_not_a_block():
    free = FreeList()
    with pytest.raises(TypeError, match="expected a Block"):
        free.add(object())
    with pytest.raises(KeyError):
        free.remove(Block(0, 64, None))
    assert free.take(64, SPLIT_MIN) is None and free.fit(64) is None and len(free) == 0


def test_blocks_in_a_cycle_through_the_c_free_list_are_collected():
    """A segment holds its free list, which holds its blocks, which hold the segment: the C list
    takes part in garbage collection, so a dropped pool's blocks go."""
    import gc

    class Segment:
        pass

    def blocks():
        return sum(1 for thing in gc.get_objects() if type(thing) is Block)

    gc.collect()
    before = blocks()
    for _ in range(20):
        segment = Segment()
        segment.free = FreeList()
        segment.free.add(Block(0, 4096, segment))
        block = segment.free.take(128, SPLIT_MIN)
        block.allocated = False
        segment.free.merge_and_add(block)       # its rest is now the list's spare
        segment.free.take(256, SPLIT_MIN)
    del segment, block
    gc.collect()
    assert blocks() == before


def test_a_size_past_64_bits_fits_nothing_and_a_negative_one_is_refused():
    """A hostile trace's size (past 2**64 once rounded) finds no block, as the Python statement
    says, instead of an OverflowError reaching the replay."""
    import pytest

    from npumem.alloc.block import FreeList

    free = FreeList()
    assert free.take(1 << 70, 512) is None and free.fit(1 << 70) is None
    assert free.at_least(1 << 70) == []
    with pytest.raises(OverflowError):
        free.take(-1, 512)
