"""The caching pool: exact split/merge arithmetic, carving rules, streams, OOM, cache control."""

import random

import pytest

from npumem.alloc.caching_allocator import CachingAllocator, OutOfMemoryError
from npumem.alloc.settings import AllocatorSettings
from npumem.alloc.sizes import SMALL_SIZE, round_request
from npumem.alloc.stats import POOLS, PoolStats
from npumem.device import SimBackend, SimConfig
from npumem.errors import InvalidParamError, MemoryFreeError
from npumem.units import MiB, align_up

MODES = {"expandable": AllocatorSettings(), "segments": AllocatorSettings(expandable_segments=False)}


@pytest.fixture(params=sorted(MODES))
def pool(request):
    backend = SimBackend(SimConfig(memory=64 * MiB))
    allocator = CachingAllocator(backend, 0, MODES[request.param])
    yield allocator
    allocator.close()
    assert backend.live_allocations(0) == []


def test_block_sizes_follow_the_carving_rule():
    for n in (1, 31, 32, 33, 100, 4096, 10_000):
        size = round_request(n, "npu")
        assert size >= align_up(n, 32) + 32 and size % 64 == 0 and size - (align_up(n, 32) + 32) < 64
    assert round_request(1, "torch") == 512 and round_request(513, "torch") == 1024
    assert round_request(1200 << 10, "npu", divisions=4) == align_up(align_up(1280 << 10, 32) + 32, 64)


def test_split_and_merge_pointer_arithmetic(pool):
    a = pool.allocate(1000)                      # 1000 -> 1056 -> 1088 bytes
    b = pool.allocate(1000)
    c = pool.allocate(100)
    assert a % 64 == 0 and b == a + 1088 and c == b + 1088
    pool.deallocate(b)
    assert pool.allocate(900) == b               # best fit reuses the hole, same stream
    pool.deallocate(a)
    pool.deallocate(b)                           # a and b merge into one 2176-byte hole
    d = pool.allocate(2000)                      # 2000 -> 2048 + 32 -> 2112 bytes: fits the merged hole
    assert d == a
    pool.deallocate(c)
    pool.deallocate(d)


def _three_holes(pool):
    """Holes of 4000, 1000 and 2000 bytes (rounded), in that address order."""
    pointers = [pool.allocate(n) for n in (4000, 64, 1000, 64, 2000, 64)]
    for i in (0, 2, 4):
        pool.deallocate(pointers[i])
    return pointers


def test_segments_take_the_smallest_hole():
    pool = CachingAllocator(SimBackend(SimConfig(memory=64 * MiB)), 0, MODES["segments"])
    pointers = _three_holes(pool)
    assert pool.allocate(900) == pointers[2]               # best fit, as PyTorch does
    assert pool.allocate(1500) == pointers[4]


def test_expandable_takes_the_lowest_hole_that_fits():
    pool = CachingAllocator(SimBackend(SimConfig(memory=64 * MiB)), 0, MODES["expandable"])
    pointers = _three_holes(pool)
    assert pool.allocate(900) == pointers[0]               # address-ordered first fit
    assert pool.allocate(1500) == pointers[0] + round_request(900, "npu")   # the rest of that hole
    assert pool.allocate(1800) == pointers[4]              # 1000 is too small; 2000 is next


def test_every_block_is_aligned_and_disjoint(pool):
    sizes = [1, 63, 64, 65, 511, 4097, 100_000, 1 << 20, 3 << 20]
    pointers = [pool.allocate(n) for n in sizes]
    spans = sorted((p, p + round_request(n, "npu")) for p, n in zip(pointers, sizes))
    assert all(start % 64 == 0 for start, _ in spans)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))


def test_streams_do_not_share_cached_blocks(pool):
    a = pool.allocate(4096, stream="A")
    pool.deallocate(a)
    assert pool.allocate(4096, stream="A") == a            # reused at once on its own stream
    b = pool.allocate(4096, stream="B")
    assert b != a


def test_record_stream_defers_reuse_until_the_event_completes():
    class FakeEvent:
        done = False

        def query(self):
            return self.done

    events = []

    def record(stream):
        events.append(FakeEvent())
        return events[-1]

    backend = SimBackend(SimConfig(memory=64 * MiB))
    pool = CachingAllocator(backend, 0, record_event=record)
    a = pool.allocate(4096, "A")
    pool.record_stream(a, "B")
    pool.deallocate(a)
    stats = pool.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0 and stats["active_bytes.all.current"] == 4160
    assert stats["active.all.current"] == 1 and stats["active_bytes.all.peak"] == 4160
    assert pool.allocate(4096, "A") != a                    # still pending on B
    events[0].done = True
    c = pool.allocate(100, "A")
    stats = pool.memory_stats()
    assert stats["active.all.current"] == 2 and c == a      # released, reused
    assert stats["active.all.peak"] == 2 and stats["active.all.freed"] == 1
    pool.close()


def test_oom_message_and_nothing_lost(pool):
    keep = pool.allocate(8 * MiB)
    before = pool.memory_stats()
    with pytest.raises(OutOfMemoryError) as info:
        pool.allocate(60 * MiB)                      # fits the device, not beside `keep`
    message = str(info.value)
    assert "Tried to allocate 60.00 MiB" in message and "total capacity of 64.00 MiB" in message
    assert "allocated by npumem" in message and "reserved by npumem but unallocated" in message
    after = pool.memory_stats()
    assert after["num_ooms"] == 1 and after["num_alloc_retries"] == 1
    for key in ("allocated_bytes.all.current", "allocation.all.current"):
        assert after[key] == before[key]
    pool.deallocate(keep)


def test_oom_path_frees_the_cache_then_succeeds():
    backend = SimBackend(SimConfig(memory=64 * MiB))
    pool = CachingAllocator(backend, 0, AllocatorSettings(expandable_segments=False))
    small = [pool.allocate(900_000) for _ in range(40)]     # many cached 2 MiB segments
    for pointer in small:
        pool.deallocate(pointer)
    assert pool.stats.current("reserved_bytes") > 30 * MiB
    big = pool.allocate(50 * MiB)                            # only fits after empty-cache-and-retry
    assert pool.stats.counters["num_alloc_retries"] == 1 and pool.stats.counters["num_ooms"] == 0
    pool.deallocate(big)
    pool.close()


def test_memory_fraction_caps_the_pool(pool):
    pool.set_memory_fraction(0.25)
    with pytest.raises(OutOfMemoryError, match="memory fraction caps this pool at 16.00 MiB"):
        pool.allocate(20 * MiB)
    pool.deallocate(pool.allocate(10 * MiB))
    with pytest.raises(InvalidParamError):
        pool.set_memory_fraction(0)


def test_empty_cache_returns_free_memory(pool):
    pointers = [pool.allocate(12 * MiB) for _ in range(4)]   # one segment each in segment mode
    for pointer in pointers[:3]:
        pool.deallocate(pointer)
    reserved = pool.stats.current("reserved_bytes")
    released = pool.empty_cache()
    assert released > 0 and pool.stats.current("reserved_bytes") == reserved - released
    assert pool.stats.current("reserved_bytes") >= 12 * MiB
    pool.deallocate(pointers[3])
    pool.empty_cache()
    assert pool.stats.current("reserved_bytes") == 0


def test_bad_frees_change_nothing(pool):
    a = pool.allocate(1000)
    before = pool.memory_stats()
    with pytest.raises(MemoryFreeError, match="points 64 bytes into"):
        pool.deallocate(a + 64)
    with pytest.raises(MemoryFreeError, match="not allocated from this pool"):
        pool.deallocate(12345)
    with pytest.raises(InvalidParamError, match="allocated for 1000 bytes"):
        pool.deallocate(a, 999)
    assert pool.memory_stats() == before
    pool.deallocate(a)
    with pytest.raises(MemoryFreeError):
        pool.deallocate(a)
    with pytest.raises(InvalidParamError):
        pool.allocate(-1)


def test_statistics_hit_rate_and_fragmentation(pool):
    a, b, c = pool.allocate(1 << 20), pool.allocate(1 << 20), pool.allocate(1 << 20)
    pool.deallocate(b)
    stats = pool.memory_stats()
    assert stats["allocation.all.current"] == 2 and stats["allocation.all.peak"] == 3
    assert stats["allocated_bytes.all.freed"] == round_request(1 << 20, "npu")
    assert stats["requested_bytes.all.current"] == 2 << 20
    assert 0 < stats["cache_hit_rate"] < 1
    frag = pool.fragmentation()
    assert frag["free"] >= frag["largest_free"] > 0
    assert frag["ratio"] == (frag["free"] - frag["largest_free"]) / frag["free"]
    assert all(0 <= s["ratio"] <= 1 for s in frag["segments"])
    pool.deallocate(a)
    pool.deallocate(c)


def test_segment_mode_policies():
    backend = SimBackend(SimConfig(memory=256 * MiB))
    pool = CachingAllocator(backend, 0, AllocatorSettings(expandable_segments=False,
                                                          max_split_size_mb=21))
    small = pool.allocate(1000)
    mid = pool.allocate(3 * MiB)
    big = pool.allocate(30 * MiB - 64)                       # exactly 30 MiB with the carving
    sizes = sorted(a.size for a in backend.live_allocations(0))
    assert sizes == [2 * MiB, 20 * MiB, 30 * MiB]           # 2 MiB small, 20 MiB mid, rounded large
    pool.deallocate(big)
    other = pool.allocate(5 * MiB)                           # an oversize cached block is not split
    assert not (big <= other < big + 30 * MiB)
    for pointer in (small, mid, other):
        pool.deallocate(pointer)
    pool.close()


@pytest.mark.parametrize("expandable", [True, False])
def test_128_byte_block_alignment_for_media_memory(expandable):
    backend = SimBackend(SimConfig(memory=64 * MiB))
    pool = CachingAllocator(backend, 0, AllocatorSettings(expandable_segments=expandable,
                                                          block_alignment=128))
    pointers = [pool.allocate(n) for n in (1, 100, 200, 3000, 70_000, 2 << 20)]
    assert all(p % 128 == 0 for p in pointers)
    pool.deallocate(pointers[2])
    assert pool.allocate(150) % 128 == 0
    pool.close()
    with pytest.raises(InvalidParamError, match="block_alignment"):
        AllocatorSettings(block_alignment=96)


def test_unsplit_remainder_pages_are_claimed_and_released():
    """A tail too small to split stays with its block; its pages are counted with the block."""
    backend = SimBackend(SimConfig(memory=64 * MiB))
    pool = CachingAllocator(backend, 0)
    page = backend.page_granularity
    head = pool.allocate(page - 32)                 # [0, page)
    middle = pool.allocate(page + 32)               # [page, 2 page + 64)
    tail = pool.allocate(4096)                      # starts 64 bytes into page 2
    pool.deallocate(middle)
    pool.settings = pool.settings.replace(block_alignment=128)
    again = pool.allocate(page - 32)                # rounds to one page: a 64-byte tail stays unsplit
    assert again == middle
    pool.deallocate(again)                          # page 2 still holds `tail`
    arena = next(iter(pool._strategy.arenas.values()))
    assert pool.empty_cache() == page               # only page 1 is idle
    assert list(arena.mapped[:3]) == [1, 0, 1]
    pool.deallocate(tail)
    pool.deallocate(head)
    assert pool.empty_cache() == 2 * page and not any(arena.mapped)
    pool.close()


def _recount(events):
    """(current, peak, total increases) per (stat, pool), counted event by event."""
    out = {}
    for name, column in (("allocation", None), ("allocated_bytes", 0), ("requested_bytes", 1)):
        for pool in POOLS:
            current = peak = grown = 0
            for event in events:
                if pool != "all" and event[2] != (pool == "small_pool"):
                    continue
                change = (1 if event[0] > 0 else -1) if column is None else event[column]
                current += change
                grown += max(change, 0)
                peak = max(peak, current)
            out[name, pool] = (current, peak, grown)
    return out


def test_statistics_counts_match_a_recount_event_by_event():
    """The pool's counts (in C) against a direct recount in Python, the oracle: current, peak
    and total increases of every stat and pool after each of a few thousand events."""
    rng = random.Random(3)
    events, live = [], []
    stats = PoolStats()
    for step in range(3000):
        if live and rng.random() < 0.45:
            size, requested, small = live.pop(rng.randrange(len(live)))
            events.append((-size, -requested, small))
            stats.free(size, requested, small)
        else:
            requested = rng.randrange(0, 4 << 20)
            size = round_request(requested, "npu")
            live.append((size, requested, size <= SMALL_SIZE))
            events.append(live[-1])
            stats.alloc(*live[-1])
        if step % 500 == 0 or step == 2999:
            for (name, pool), expected in _recount(events).items():
                stat = stats.stat(name, pool)
                assert (stat.current, stat.peak, stat.allocated) == expected, (name, pool, step)


def test_statistics_counts_refuse_what_they_cannot_count():
    stats = PoolStats()
    with pytest.raises(ValueError, match="sizes must be"):
        stats.alloc(-1, 0, True)
    with pytest.raises(ValueError, match="sizes must be"):
        stats.free(1 << 60, 0, False)
    with pytest.raises(TypeError):
        stats.alloc(64, 64)
    with pytest.raises(ValueError, match="no stat's"):
        stats.counts.add(1, True, 5)
    assert stats.stat("allocation").allocated == 0      # nothing was counted


def test_pool_statistics_stay_exact_over_many_events():
    backend = SimBackend(SimConfig(memory=256 * MiB))
    pool = CachingAllocator(backend, 0)
    rng, live, peak = random.Random(5), [], 0
    for _ in range(6000):
        if live and rng.random() < len(live) / 100:
            pool.deallocate(live.pop(rng.randrange(len(live))))
        else:
            live.append(pool.allocate(rng.randrange(1, 1 << 20)))
        peak = max(peak, sum(pool._allocated[p].size for p in live))
    stats = pool.memory_stats()
    assert stats["allocated_bytes.all.peak"] == peak
    assert stats["allocation.all.current"] == len(live)
    assert stats["num_cache_hits"] + stats["num_cache_misses"] == stats["allocation.all.allocated"]
    for pointer in live:
        pool.deallocate(pointer)
    pool.close()


def test_the_inlined_rounding_matches_the_carving_rule():
    """allocate() rounds default-setting requests inline; blocks must still be cut exactly where
    round_request says (the next block starts right after)."""
    backend = SimBackend(SimConfig(memory=64 * MiB))
    pool = CachingAllocator(backend, 0)
    for n in [*range(0, 300), 1000, 4095, 4096, 4097, 65_535, 1 << 20, (1 << 20) + 1, 3_000_001]:
        first, second = pool.allocate(n), pool.allocate(1)
        assert second - first == round_request(n, "npu"), n
        pool.deallocate(first)
        pool.deallocate(second)
    pool.close()


def test_oom_on_a_ddr_device_reports_its_free_memory():
    """A device with DDR and no HBM: capacity, the OOM message and the oom event all read DDR."""
    from npumem.observe import OBSERVERS

    class Recorder:
        def __init__(self):
            self.events = []

        def on_memory(self, owner, action, device, address, size, requested, stream):
            self.events.append((action, address))

    backend = SimBackend(SimConfig(memory=64 * MiB, memory_kind="ddr"))
    pool = CachingAllocator(backend, 0)
    assert pool.capacity == 64 * MiB
    recorder = Recorder()
    OBSERVERS.add(recorder)
    try:
        with pytest.raises(OutOfMemoryError, match="whole capacity of 64.00 MiB"):
            pool.allocate(128 * MiB)
    finally:
        OBSERVERS.remove(recorder)
    assert ("oom", 64 * MiB) in recorder.events          # the free bytes ride in the address
    pool.close()


def test_a_destroyed_streams_arena_goes_back_to_the_device():
    """Issue 19, item 10: arenas piled up with each stream (32 GiB of address space each) until
    allocation failed after about 4,000 streams."""
    import numpy as np
    import npumem
    import npumem.memory as mem

    npumem.init()
    npumem.set_device(0)
    try:
        pool = mem.get_allocator()
        strategy = pool._strategy
        for _ in range(300):
            stream = npumem.create_stream()
            x = npumem.from_numpy(np.ones(1024, np.float32), stream)
            stream.synchronize()
            del x
            npumem.destroy_stream(stream)
        assert len(strategy.arenas) <= 1 and not pool._gone_streams
        stream = npumem.create_stream()                  # a tensor outliving its stream
        kept = npumem.from_numpy(np.ones(1024, np.float32), stream)
        stream.synchronize()
        npumem.destroy_stream(stream)
        assert stream in pool._gone_streams and stream in strategy.arenas
        del kept
        mem.memory_stats()                                   # frees queued by finalizers run
        assert stream not in strategy.arenas and not pool._gone_streams
    finally:
        npumem.finalize()


@pytest.mark.parametrize("expandable", [True, False], ids=["expandable", "segments"])
def test_serves_from_cache_says_whether_a_request_needs_new_memory(expandable):
    """The predictive pool asks this before giving up a plan for a request it did not foresee:
    a request the pool's cache serves cannot raise reserved memory."""
    pool = CachingAllocator(SimBackend(SimConfig(memory=1 << 30)), 0,
                            AllocatorSettings(expandable_segments=expandable))
    strategy = pool._strategy
    pointer = pool.allocate(6 * MiB)
    pool.deallocate(pointer)                  # 6 MiB cached
    reserved = pool.memory_stats()["reserved_bytes.all.current"]
    assert strategy.serves_from_cache(4 * MiB, None)
    assert not strategy.serves_from_cache(64 * MiB, None)
    pointer = pool.allocate(4 * MiB)
    assert pool.memory_stats()["reserved_bytes.all.current"] == reserved
    pool.deallocate(pointer)
    pool.close()
