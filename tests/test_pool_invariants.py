"""Hypothesis state machines over the caching pool, in both modes and both size flavours.

After every step: no two live blocks overlap, every block meets the size and alignment rules,
the statistics equal a recount, reserved memory equals what the device really holds for the
pool; after empty_cache only memory under live blocks remains; after any error nothing changed.
"""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from npumem.alloc.caching_allocator import CachingAllocator, OutOfMemoryError
from npumem.alloc.settings import AllocatorSettings
from npumem.alloc.sizes import round_request
from npumem.constants import MemAttr
from npumem.device import SimBackend, SimConfig
from npumem.errors import InvalidParamError, MemoryFreeError
from npumem.units import MiB

sizes = st.one_of(st.integers(0, 2048), st.integers(2048, 1 << 20), st.integers(1 << 20, 24 * MiB))
streams = st.sampled_from([None, "s1", "s2"])


class PoolMachine(RuleBasedStateMachine):
    settings_under_test = AllocatorSettings()
    flavour = "npu"

    def __init__(self):
        super().__init__()
        self.backend = SimBackend(SimConfig(memory=64 * MiB))
        self.pool = CachingAllocator(self.backend, 0, self.settings_under_test, flavour=self.flavour)
        self.live = {}       # pointer -> (requested, stream)

    def teardown(self):
        self.pool.close()
        assert self.backend.live_allocations(0) == []

    def _state(self):
        return (self.pool.memory_stats(), sorted(self.pool._allocated),
                self.backend.mem_info(0, MemAttr.HBM_MEM))

    @rule(nbytes=sizes, stream=streams)
    def allocate(self, nbytes, stream):
        before = self._state()
        try:
            pointer = self.pool.allocate(nbytes, stream)
        except OutOfMemoryError:
            after = self._state()
            assert after[1] == before[1]
            assert after[0]["allocated_bytes.all.current"] == before[0]["allocated_bytes.all.current"]
            return
        assert pointer not in self.live
        self.live[pointer] = (nbytes, stream)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def deallocate(self, data):
        pointer = data.draw(st.sampled_from(sorted(self.live)))
        self.pool.deallocate(pointer)
        del self.live[pointer]

    @rule(offset=st.integers(1, 4096))
    def bad_free(self, offset):
        before = self._state()
        target = (min(self.live) + offset) if self.live else 12345
        if target in self.live:
            return
        try:
            self.pool.deallocate(target)
        except (MemoryFreeError, InvalidParamError):
            assert self._state() == before
            return
        raise AssertionError("a bad free was accepted")

    @rule()
    def bad_size(self):
        before = self._state()
        try:
            self.pool.allocate(-5)
        except InvalidParamError:
            assert self._state() == before
            return
        raise AssertionError("a negative size was accepted")

    @rule()
    def empty_cache(self):
        self.pool.empty_cache()
        held = sum(length for *_, mapped in self.pool._strategy.views() for _, length in mapped)
        assert held == self.pool.stats.current("reserved_bytes")
        for stream, small, blocks, mapped in self.pool._strategy.views():
            for run_start, run_length in mapped:
                assert any(b.allocated and b.start < run_start + run_length and b.end > run_start
                           for b in blocks), "empty_cache left memory no live block uses"

    @invariant()
    def blocks_are_disjoint_and_follow_the_rules(self):
        blocks = sorted(self.pool._allocated.values(), key=lambda b: b.start)
        assert {b.start for b in blocks} == set(self.live)
        for block in blocks:
            requested, stream = self.live[block.start]
            assert block.start % 64 == 0 and block.size % 64 == 0
            assert block.size >= round_request(requested, self.flavour) and block.requested == requested
            assert block.stream == stream
        assert all(a.end <= b.start for a, b in zip(blocks, blocks[1:]))

    @invariant()
    def stats_equal_a_recount(self):
        stats = self.pool.memory_stats()
        blocks = list(self.pool._allocated.values())
        assert stats["allocation.all.current"] == len(blocks)
        assert stats["allocated_bytes.all.current"] == sum(b.size for b in blocks)
        assert stats["requested_bytes.all.current"] == sum(b.requested for b in blocks)
        small = [b for b in blocks if b.small]
        assert stats["allocated_bytes.small_pool.current"] == sum(b.size for b in small)
        assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"]
        free, total = self.backend.mem_info(0, MemAttr.HBM_MEM)
        assert stats["reserved_bytes.all.current"] == total - free
        assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"] or \
            not self.pool.expandable

    @invariant()
    def the_quick_fragmentation_equals_a_walk_over_the_blocks(self):
        """The sampler's O(free lists) ratio is the one the full walk computes."""
        assert self.pool.fragmentation_ratio() == self.pool.fragmentation()["ratio"]


class SegmentPoolMachine(PoolMachine):
    settings_under_test = AllocatorSettings(expandable_segments=False, max_split_size_mb=32,
                                            garbage_collection_threshold=0.5)


class TorchEmulationMachine(PoolMachine):
    settings_under_test = AllocatorSettings(expandable_segments=False)
    flavour = "torch"


CONFIG = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestExpandablePool = PoolMachine.TestCase
TestSegmentPool = SegmentPoolMachine.TestCase
TestTorchEmulation = TorchEmulationMachine.TestCase
TestExpandablePool.settings = TestSegmentPool.settings = TestTorchEmulation.settings = CONFIG
