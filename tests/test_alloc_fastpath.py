"""The cache-hit fast paths of the pool and of npumem.memory (issue 42, item 4).

The public calls find the current context and stream without the runtime's lock
(RUNTIME._context_in_use and _stream_in_use); the free list reuses the block object a merge let
go as the rest of the next split, and looks for that rest where the split left it. These tests
hold the fast paths to the answers, errors and structures of the plain ones.
"""

from __future__ import annotations

import random
import threading

import pytest

import npumem
import npumem.memory as mem
from npumem.alloc.block import FreeList
from npumem.alloc.caching_allocator import CachingAllocator
from npumem.alloc.settings import AllocatorSettings
from npumem.device import SimBackend, SimConfig, sanitizer
from npumem.errors import InvalidParamError, MemoryFreeError
from npumem.runtime.state import RUNTIME
from npumem.units import MiB


@pytest.fixture
def sanitizer_off():
    """The suite runs with the sanitizer on; the fast delete path is the one with it off."""
    was = sanitizer.SANITIZER.level
    sanitizer.disable()
    yield
    sanitizer.enable(was) if was != "off" else sanitizer.disable()


def _stream_of(pointer: int):
    for pool in mem._pools.values():
        block = pool._allocated.get(pointer)
        if block is not None:
            return pool, block.stream
    raise AssertionError(f"0x{pointer:x} is in no pool")


def _expected():
    """What the plain path picks: the pool of the current device, the current stream."""
    context = RUNTIME._context_in_use()
    return mem._pools[context.device], RUNTIME._stream_in_use(context)


def _alloc_where_expected(size: int = 4096) -> int:
    mem.get_allocator()          # the fast path serves pools that exist
    pointer = mem.caching_allocator_alloc(size)
    assert _stream_of(pointer) == _expected()
    return pointer


@pytest.mark.parametrize("sanitize", ["off", "on"])
def test_public_calls_pick_the_current_context_and_stream(rt, sanitize, request):
    if sanitize == "off":
        request.getfixturevalue("sanitizer_off")
    pointers = [_alloc_where_expected()]
    side = npumem.Stream()
    with RUNTIME.using_stream(side):
        pointer = _alloc_where_expected()
        assert _stream_of(pointer)[1] is side
        pointers.append(pointer)
        with RUNTIME.using_stream(None):
            pointers.append(_alloc_where_expected())
    for pointer in pointers:
        mem.caching_allocator_delete(pointer)
    doomed = npumem.Stream()
    with RUNTIME.using_stream(doomed):
        RUNTIME.destroy_stream(doomed)        # a destroyed stream: the default stream again
        pointer = _alloc_where_expected()
        assert _stream_of(pointer)[1] is RUNTIME.lazy_context().default_stream
        mem.caching_allocator_delete(pointer)
    assert mem.memory_allocated() == 0


def test_public_calls_follow_devices_and_contexts(rt, sanitizer_off):
    first = _alloc_where_expected()
    npumem.set_device(1)
    second = _alloc_where_expected()
    assert _stream_of(second)[0] is mem._pools[1]
    npumem.set_device(0)
    context = RUNTIME.create_context(0)               # not the default context of device 0
    third = _alloc_where_expected()
    assert _stream_of(third)[1] is context.default_stream
    for pointer in (first, second, third):
        mem.caching_allocator_delete(pointer)
    RUNTIME.destroy_context(context)
    fourth = _alloc_where_expected()                  # back on the device's default context
    mem.caching_allocator_delete(fourth)
    assert mem.memory_allocated(0) == mem.memory_allocated(1) == 0


def test_public_calls_on_a_thread_without_a_device_of_its_own(rt, sanitizer_off):
    mem.get_allocator()
    found, errors = [], []

    def worker():
        try:
            assert getattr(RUNTIME._thread, "context", None) is None
            pointer = mem.caching_allocator_alloc(1000)
            found.append((_stream_of(pointer), _expected()))
            mem.caching_allocator_delete(pointer)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not errors
    assert found[0][0] == found[0][1]
    assert mem.memory_allocated() == 0


def test_public_calls_start_the_runtime_lazily():
    assert not npumem.is_initialized()
    pointer = mem.caching_allocator_alloc(100)
    assert npumem.is_initialized() and _stream_of(pointer) == _expected()
    mem.caching_allocator_delete(pointer)


@pytest.mark.parametrize("sanitize", ["off", "on"])
def test_public_errors_are_unchanged(rt, sanitize, request):
    if sanitize == "off":
        request.getfixturevalue("sanitizer_off")
    pointer = mem.caching_allocator_alloc(4096)
    with pytest.raises(MemoryFreeError, match=r"was not allocated by the caching allocator"):
        mem.caching_allocator_delete(pointer + 64)
    mem.caching_allocator_delete(pointer)
    with pytest.raises(MemoryFreeError, match=f"0x{pointer:x} was not allocated by the caching "
                                              "allocator"):
        mem.caching_allocator_delete(pointer)
    with pytest.raises(MemoryFreeError, match="was not allocated by the caching allocator"):
        mem.caching_allocator_delete(12345)
    with pytest.raises(InvalidParamError, match="must not be negative"):
        mem.caching_allocator_alloc(-1)
    for bad, shown in ((1.5, "float 1.5"), ("10", "str '10'"), (True, "bool True")):
        with pytest.raises(InvalidParamError, match=f"size must be an integer, got {shown}"):
            mem.caching_allocator_alloc(bad)
    assert mem.memory_allocated() == 0


def test_a_refused_sized_free_changes_nothing():
    pool = CachingAllocator(SimBackend(SimConfig(memory=64 * MiB)), 0)
    pointers = [pool.allocate(n) for n in (100, 2000, 30000)]
    order = list(pool._allocated)
    with pytest.raises(InvalidParamError, match=r"the block was allocated for 2000 bytes"):
        pool.deallocate(pointers[1], 1999)
    assert list(pool._allocated) == order
    with pytest.raises(MemoryFreeError, match="points 64 bytes into"):
        pool.deallocate(pointers[1] + 64, 2000)
    with pytest.raises(MemoryFreeError, match="not allocated from this pool"):
        pool.deallocate(12345)
    pool.deallocate(pointers[1], 2000)
    pool.deallocate(pointers[0])
    pool.deallocate(pointers[2], 30000)
    assert pool.stats.current("allocated_bytes") == 0
    assert pool.stats.peak("allocated_bytes") == sum((((n + 31) & -32) + 95) & -64
                                                     for n in (100, 2000, 30000))
    assert pool.close() == []


def _check_free_list(free: FreeList, chains) -> None:
    """The list holds exactly the free blocks of the chains, in (size, start) order, with
    matching keys and starts; its spare block is in no chain and not in the list."""
    blocks = [block for first in chains for block in _walk(first)]
    assert len({id(block) for block in blocks}) == len(blocks)
    free_blocks = sorted((b for b in blocks if not b.allocated), key=lambda b: (b.size, b.start))
    assert free._blocks == free_blocks
    assert free._keys == [b.size << 64 | b.start for b in free_blocks]
    assert free._starts == [b.start for b in free_blocks]
    assert free._spare is None or all(free._spare is not b for b in blocks)


def _walk(first):
    block, previous = first, None
    while block is not None:
        assert block.prev is previous
        if previous is not None:
            assert previous.end == block.start
            assert previous.allocated or block.allocated, "free neighbours must merge"
        previous, block = block, block.next
    return _chain(first)


def _chain(first):
    out = []
    while first is not None:
        out.append(first)
        first = first.next
    return out


@pytest.mark.parametrize("expandable", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_recycled_blocks_keep_the_lists_whole(seed, expandable):
    """Random lifetimes (not just pairs): splits reuse merged-away blocks, merges look where the
    last split left the rest; the chains and free lists stay exact and stats stay right."""
    rng = random.Random(seed)
    backend = SimBackend(SimConfig(memory=256 * MiB))
    pool = CachingAllocator(backend, 0, AllocatorSettings(expandable_segments=expandable))
    live, peak, now = {}, 0, 0
    for step in range(3000):
        if live and (rng.random() < 0.45 or len(live) > 40):
            pointer = rng.choice(sorted(live))
            now -= pool._allocated[pointer].size
            nbytes = live.pop(pointer)
            pool.deallocate(pointer, nbytes if rng.random() < 0.5 else None)
        else:
            nbytes = rng.choice([rng.randrange(0, 4096), rng.randrange(4096, 2 << 20),
                                 rng.randrange(2 << 20, 12 << 20)])
            pointer = pool.allocate(nbytes, rng.choice([None, None, "other"]))
            live[pointer] = nbytes
            now += pool._allocated[pointer].size
            peak = max(peak, now)
        if step % 97 == 0 or step > 2900:
            strategy = pool._strategy
            if expandable:
                for arena in strategy.arenas.values():
                    _check_free_list(arena.free, [arena.first])
            else:
                for (stream, small), free in strategy.free_lists.items():
                    chains = [s.first for s in strategy.segments.values()
                              if s.stream == stream and s.small == small]
                    _check_free_list(free, chains)
            assert pool.stats.current("allocated_bytes") == now
            assert pool.stats.peak("allocated_bytes") == peak
    for pointer in list(live):
        pool.deallocate(pointer)
    assert pool.stats.current("allocation") == 0
    assert pool.close() == []
    assert backend.live_allocations(0) == []
