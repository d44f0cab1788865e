"""StaticPlan: a recorded step served from one planned arena, with safe fallbacks."""

import pytest
from hypothesis import given, settings, strategies as st

from npumem.alloc import StaticPlan
from npumem.alloc.caching_allocator import CachingAllocator
from npumem.device import SimBackend, SimConfig
from npumem.errors import InvalidParamError, MemoryFreeError
from npumem.trace import TraceEvent
from npumem.units import MiB

STEP = [TraceEvent(0, "alloc", 1, 1000), TraceEvent(1, "alloc", 2, 3 * MiB),
        TraceEvent(2, "free", 1, 1000), TraceEvent(3, "alloc", 3, 1000),
        TraceEvent(4, "free", 2, 3 * MiB), TraceEvent(5, "alloc", 4, 2 * MiB),
        TraceEvent(6, "free", 3, 1000), TraceEvent(7, "free", 4, 2 * MiB)]


@pytest.fixture
def pool():
    backend = SimBackend(SimConfig(memory=64 * MiB))
    pool = CachingAllocator(backend)
    yield pool
    pool.close()
    backend.close()


def run_step(arena, events):
    live = {}
    arena.begin_step()
    for event in events:
        if event.action == "alloc":
            live[event.addr] = arena.allocate(event.size)
        else:
            arena.deallocate(live.pop(event.addr))
    return live


def test_replayed_steps_are_served_from_the_arena_with_reuse(pool):
    arena = StaticPlan.from_trace(STEP, pool, time_limit=0.5)
    assert arena.plan.height <= 3 * MiB + 2048 + 256          # the 1000-byte blocks share space
    for _ in range(3):
        assert run_step(arena, STEP) == {}
    stats = arena.stats()
    assert stats["planned_allocs"] == 12 and stats["fallback_allocs"] == 0 and stats["steps"] == 3
    assert pool.memory_stats()["num_device_alloc"] >= 1
    arena.close()


def test_pointers_are_aligned_and_inside_the_arena(pool):
    arena = StaticPlan.from_trace(STEP, pool, time_limit=0.5)
    arena.begin_step()
    first = arena.allocate(1000)
    second = arena.allocate(3 * MiB)
    for pointer in (first, second):
        assert pointer % 64 == 0 and arena.base <= pointer < arena.base + arena.arena_bytes
    arena.deallocate(first)
    arena.deallocate(second)
    arena.close()


def test_a_longer_lived_buffer_makes_the_next_request_fall_back(pool):
    arena = StaticPlan.from_trace(STEP, pool, time_limit=0.5)
    arena.begin_step()
    a = arena.allocate(1000)
    b = arena.allocate(3 * MiB)
    c = arena.allocate(1000)              # recorded after a's free; a still lives here
    assert arena.stats()["fallback_allocs"] in (0, 1)
    # Whatever was planned, no two live blocks overlap.
    spans = sorted([(a, 1000), (b, 3 * MiB), (c, 1000)])
    assert all(x + n <= y for (x, n), (y, _) in zip(spans, spans[1:]))
    for pointer in (a, b, c):
        arena.deallocate(pointer)
    arena.close()


def test_different_sizes_and_extra_requests_fall_back(pool):
    arena = StaticPlan.from_trace(STEP, pool, time_limit=0.5)
    arena.begin_step()
    odd = arena.allocate(999)                        # not the recorded 1000 bytes
    extra = [arena.allocate(512) for _ in range(6)]  # past the end of the plan
    assert arena.stats()["fallback_allocs"] == 7 and pool.owns(odd)
    for pointer in [odd, *extra]:
        arena.deallocate(pointer)
    arena.close()


def test_bad_input_changes_nothing(pool):
    arena = StaticPlan.from_trace(STEP, pool, time_limit=0.5)
    arena.begin_step()
    kept = arena.allocate(1000)
    with pytest.raises(InvalidParamError, match="non-negative integer"):
        arena.allocate(-1)
    with pytest.raises(MemoryFreeError, match="not allocated here"):
        arena.deallocate(kept + 64)
    with pytest.raises(InvalidParamError, match="still allocated"):
        arena.close()
    assert arena.owns(kept) and arena.stats()["live_planned"] == 1
    arena.deallocate(kept)
    with pytest.raises(MemoryFreeError):
        arena.deallocate(kept)
    arena.close()
    with pytest.raises(InvalidParamError, match="allocated twice"):
        StaticPlan.from_trace([TraceEvent(0, "alloc", 1, 8), TraceEvent(1, "alloc", 1, 8)], pool)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 70000)), min_size=1, max_size=30), st.randoms())
def test_any_request_sequence_keeps_live_blocks_apart(ops, rng):
    """Replays of a recorded step with random deviations: live blocks never overlap."""
    backend = SimBackend(SimConfig(memory=256 * MiB))
    pool = CachingAllocator(backend)
    arena = StaticPlan.from_trace(STEP, pool, time_limit=0.2)
    live = {}
    arena.begin_step()
    for is_alloc, size in ops:
        if is_alloc or not live:
            size = rng.choice([1000, 3 * MiB, 2 * MiB, size])
            pointer = arena.allocate(size)
            live[pointer] = size
        else:
            pointer = rng.choice(sorted(live))
            arena.deallocate(pointer)
            del live[pointer]
        spans = sorted(live.items())
        assert all(x + n <= y for (x, n), (y, _) in zip(spans, spans[1:]))
        if rng.random() < 0.1:
            arena.begin_step()
    for pointer in list(live):
        arena.deallocate(pointer)
    arena.close()
    pool.close()
    backend.close()
