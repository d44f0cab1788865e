"""The device memory of a step's layout: one address range whose pages are mapped as the planned
blocks first touch them (backends with virtual memory), or one allocation (other backends).

Mapping on demand is what keeps prediction from raising peak reserved memory: while the arena
fills, the blocks the pool served before it still hold their pages, and the arena's pages for
slots those blocks stand in for stay unmapped. A page is mapped only while reserved memory stays
within the peak the pool already reached (after giving back the pool's idle pages); otherwise
the request is a miss and the pool serves it, as it would have without prediction.
"""

from __future__ import annotations

from bisect import bisect_left

from ..constants import MallocPolicy
from ..errors import MemoryAllocationError
from .block import Block
from .expandable import _runs
from .step_plan import StepLayout


class ArenaSegment:
    """What a planned Block's `segment` is: the pool returns freed blocks to `free` (the
    Predictor), which finds their `arena`."""

    __slots__ = ("stream", "free", "arena")

    def __init__(self, stream, free, arena):
        self.stream, self.free, self.arena = stream, free, arena


class StepArena:
    """`layout`'s memory for `stream`, taken from `pool`'s backend; `blocks[slot]` are the
    planned blocks, whose frees go to `owner.merge_and_add`."""

    def __init__(self, pool, layout: StepLayout, stream, owner):
        self.pool, self.owner, self.size = pool, owner, layout.arena_bytes
        backend = pool.backend
        self.shift = backend.page_granularity.bit_length() - 1
        if backend.supports_virtual_memory:
            self.reservation = backend.reserve(pool.device, self.size)
            self.mapped = bytearray(self.size >> self.shift)
            pool.on_device_memory(0, False, segments=+1)
        else:
            self.reservation = backend.allocate(pool.device, self.size, self.size,
                                                MallocPolicy.HUGE_FIRST, "malloc_align32")
            self.mapped = None
            pool.on_device_memory(+self.size, False, segments=+1)
            pool.note_segment("segment_alloc", self.reservation.start, self.size, stream)
        self.reservation.pool = pool          # the pool sanitizer checks accesses against blocks
        self.start, self.stream = self.reservation.start, stream
        segment = ArenaSegment(stream, owner, self)
        self.blocks = [Block(self.start + offset, size, segment)
                       for offset, size in zip(layout.offsets, layout.template.sizes)]
        self.live_starts: list[int] = []          # live planned blocks, by address
        self.live_ends: list[int] = []

    def place(self, slot: int) -> Block | None:
        """Slot `slot`'s block, if no live block overlaps it (one that lived longer than
        planned may) and its pages can be mapped; else None."""
        block = self.blocks[slot]
        start, end = block.start, block.start + block.size
        starts = self.live_starts
        at = bisect_left(starts, start)
        if (at < len(starts) and starts[at] < end) or (at and self.live_ends[at - 1] > start):
            return None
        if self.mapped is not None and not self.ensure_mapped(block):
            return None
        starts.insert(at, start)
        self.live_ends.insert(at, end)
        return block

    def remove(self, block: Block) -> None:
        at = bisect_left(self.live_starts, block.start)
        del self.live_starts[at], self.live_ends[at]

    def free_runs(self):
        """(low, high) of the free bytes between live planned blocks."""
        low = self.start
        for start, end in zip(self.live_starts, self.live_ends):
            if start > low:
                yield low, start
            low = max(low, end)
        if low < self.start + self.size:
            yield low, self.start + self.size

    def largest_free_run(self) -> int:
        """The longest free run on mapped pages."""
        mapped = self.mapped_ranges()
        return max([0] + [min(high, start + length) - max(low, start)
                          for low, high in self.free_runs() for start, length in mapped])

    def view(self):
        """(stream, small, blocks, mapped ranges) for reports, as the strategies give them."""
        free_segment = ArenaSegment(self.stream, None, self)
        live = {block.start: block for block in self.blocks if block.allocated}
        pieces = [Block(low, high - low, free_segment) for low, high in self.free_runs()]
        pieces += [live[start] for start in self.live_starts if start in live]
        pieces.sort(key=lambda block: block.start)
        return self.stream, False, pieces, self.mapped_ranges()

    def ensure_mapped(self, block: Block) -> bool:
        """Map the pages under `block`; False when that would raise reserved memory above its
        peak (or the device is full)."""
        mapped = self.mapped
        offset = block.start - self.start
        first, end = offset >> self.shift, ((offset + block.size - 1) >> self.shift) + 1
        if mapped.find(0, first, end) < 0:
            return True
        pool = self.pool
        runs = _runs(mapped, 0, first, end)
        need = sum(count for _, count in runs) << self.shift
        within = min(max(self.owner.peak_before, need), pool.limit)
        if pool.stats.current("reserved_bytes") + need > within:
            pool.release_idle_cache()
            if pool.stats.current("reserved_bytes") + need > within:
                return False
        done = []
        try:
            for page, count in runs:
                pool.backend.map(self.reservation, page << self.shift, count << self.shift)
                done.append((page, count))
        except MemoryAllocationError:
            self._unmap(done)
            return False
        for page, count in done:
            mapped[page:page + count] = b"\x01" * count
            pool.note_segment("segment_map", self.start + (page << self.shift),
                              count << self.shift, self.stream)
        pool.on_device_memory(+need, False, calls=len(done))
        return True

    def unmap_idle_pages(self) -> None:
        """Unmap the mapped pages no live block touches (a replaced arena, draining)."""
        if self.mapped is None:
            return
        shift, idle = self.shift, []
        for low, high in self.free_runs():
            first, end = (low - self.start + (1 << shift) - 1) >> shift, (high - self.start) >> shift
            if first < end:
                idle += _runs(self.mapped, 1, first, end)
        for page, count in idle:
            self.pool.note_segment("segment_unmap", self.start + (page << shift), count << shift,
                                   self.stream)
            self.mapped[page:page + count] = bytes(count)
        self._unmap(idle)
        if idle:
            self.pool.on_device_memory(-(sum(count for _, count in idle) << shift), False,
                                       calls=len(idle))

    def _unmap(self, runs) -> None:
        for page, count in runs:
            self.pool.backend.unmap(self.reservation, page << self.shift, count << self.shift)

    def mapped_ranges(self) -> list[tuple[int, int]]:
        if self.mapped is None:
            return [(self.start, self.size)]
        return [(self.start + (page << self.shift), count << self.shift)
                for page, count in _runs(self.mapped, 1, 0, len(self.mapped))]

    def release(self) -> None:
        """Give the memory back (no planned block may be live)."""
        pool = self.pool
        if self.mapped is None:
            pool.note_segment("segment_free", self.start, self.size, self.stream)
            pool.backend.free(self.start, "free")
            pool.on_device_memory(-self.size, False, segments=-1)
            return
        runs = _runs(self.mapped, 1, 0, len(self.mapped))
        for page, count in runs:
            pool.note_segment("segment_unmap", self.start + (page << self.shift),
                              count << self.shift, self.stream)
        self._unmap(runs)
        pool.on_device_memory(-(sum(count for _, count in runs) << self.shift), False,
                              segments=-1, calls=len(runs))
        pool.backend.free(self.start, "release")
