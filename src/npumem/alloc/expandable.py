"""Expandable mode (npumem's default): one growing address range per stream, pages on demand.

Each stream gets an arena: a reservation of address space as large as the device, carved into
blocks by the carving rules, with 2 MiB pages mapped under a block when it is handed out.
A request takes the lowest-addressed free block large enough (address-ordered first fit): live
blocks pack toward the bottom, so the top stays one free run whose pages can be unmapped, and
holes sit next to each other and merge. On recorded workloads it reserved less than best fit
and, above all, varied less when request sizes were perturbed (docs/benchmarks.md).
A page whose blocks are all free stays mapped (a reuse costs nothing), until the pool must map new
pages or `empty_cache` runs: then free pages of idle streams are unmapped first. So reserved memory
tracks the pages live blocks touch, the address range never fragments into unusable segments, and
a block freed on one stream only reaches another stream as pages, once its stream is idle.
"""

from __future__ import annotations

from ..errors import MemoryAllocationError
from .block import Block, FreeList


class Arena:
    """The address range of one stream."""

    __slots__ = ("reservation", "base", "stream", "free", "first", "mapped")

    def __init__(self, reservation, stream, page_shift: int):
        self.reservation = reservation
        self.base = reservation.start
        self.stream = stream
        self.first = Block(reservation.start, reservation.size, self)
        self.free = FreeList()
        self.free.add(self.first)
        self.mapped = bytearray(reservation.size >> page_shift)   # 1 where a page is mapped

    def blocks(self):
        block = self.first
        while block is not None:
            yield block
            block = block.next


def _runs(flags: bytearray, value: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Runs of `value` in flags[lo:hi] as (first, count), found at C speed with find()."""
    runs, other = [], 1 - value
    first = flags.find(value, lo, hi)
    while first >= 0:
        stop = flags.find(other, first, hi)
        if stop < 0:
            stop = hi
        runs.append((first, stop - first))
        first = flags.find(value, stop, hi) if stop < hi else -1
    return runs


class ExpandableStrategy:
    """Arenas per stream over the backend's virtual memory. `owner` is the CachingAllocator.

    Which pages are in use is not counted per page on the hot path: a mapped page is idle exactly
    when it lies wholly inside one free block (free neighbours always merge), so idle pages are
    found from the free list's large blocks when something must be unmapped — a rare event.
    """

    expandable = True

    def __init__(self, owner):
        self.owner = owner
        self.page = owner.backend.page_granularity
        self.shift = self.page.bit_length() - 1
        self.arenas: dict[object, Arena] = {}

    def _arena(self, stream) -> Arena:
        arena = self.arenas.get(stream)
        if arena is None:
            reservation = self.owner.backend.reserve(self.owner.device, self.owner.capacity)
            reservation.pool = self.owner      # the sanitizer checks accesses against its blocks
            arena = self.arenas[stream] = Arena(reservation, stream, self.shift)
            self.owner.on_device_memory(0, False, segments=+1)
        return arena

    def take(self, size: int, stream) -> Block | None:
        """A block of `size` bytes for `stream`, or None when its pages cannot be mapped."""
        arena = self.arenas.get(stream) or self._arena(stream)
        block = arena.free.take(size, self.owner.split_min, None, True)    # first fit
        if block is None:
            return None
        # the block's pages (an unsplit tail included), as _pages finds them: all mapped is
        # the cache hit
        offset, shift = block.start - arena.base, self.shift
        first, end = offset >> shift, ((offset + block.size - 1) >> shift) + 1
        if arena.mapped.find(0, first, end) < 0:
            return block
        if not self._map(arena, first, end):
            arena.free.merge_and_add(block)
            return None
        self.owner.stats.counters["num_cache_misses"] += 1
        return block

    def serves_from_cache(self, size: int, stream) -> bool:
        """Whether `take(size, stream)` would find its bytes on mapped pages."""
        arena = self.arenas.get(stream)
        block = arena.free.fit(size, first_fit=True) if arena is not None else None
        if block is None:
            return False
        if block.size - size < self.owner.split_min:        # take keeps the whole block
            size = block.size
        first, end = self._pages(arena, block.start, size)
        return arena.mapped.find(0, first, end) < 0

    def _pages(self, arena: Arena, start: int, size: int) -> tuple[int, int]:
        """The range of the arena's pages that [start, start + size) touches."""
        offset = start - arena.base
        return offset >> self.shift, ((offset + size - 1) >> self.shift) + 1

    def _map(self, arena: Arena, first: int, end: int) -> bool:
        """Map the unmapped pages in [first, end), after unmapping idle pages of idle streams."""
        owner = self.owner
        self.unmap_idle(only_idle_streams=True)     # keep what is mapped close to what is live
        runs = _runs(arena.mapped, 0, first, end)
        need = sum(count for _, count in runs) << self.shift
        if owner.stats.current("reserved_bytes") + need > owner.limit:
            return False
        done = []
        try:
            for page, count in runs:
                owner.backend.map(arena.reservation, page << self.shift, count << self.shift)
                done.append((page, count))
        except MemoryAllocationError:
            for page, count in done:
                owner.backend.unmap(arena.reservation, page << self.shift, count << self.shift)
            return False
        for page, count in done:
            arena.mapped[page:page + count] = b"\x01" * count
        owner.on_device_memory(+need, False, calls=len(done))
        for page, count in done:
            owner.note_segment("segment_map", arena.base + (page << self.shift), count << self.shift,
                               arena.stream)
        return True

    def _idle_runs(self, arena: Arena) -> list[tuple[int, int]]:
        """Mapped pages no live block touches: those wholly inside a free block."""
        runs, shift, page = [], self.shift, self.page
        for block in arena.free.at_least(page):
            offset = block.start - arena.base
            first, end = (offset + page - 1) >> shift, (offset + block.size) >> shift
            if first < end:
                runs.extend(_runs(arena.mapped, 1, first, end))
        return runs

    def unmap_idle(self, streams=None, only_idle_streams: bool = False) -> int:
        """Unmap mapped pages no live block touches; bytes released."""
        owner = self.owner
        released = 0
        for arena in self.arenas.values():
            if streams is not None and arena.stream not in streams:
                continue
            runs = self._idle_runs(arena)
            if not runs or (only_idle_streams and not owner.stream_idle(arena.stream)):
                continue
            released += self.unmap_runs(arena, runs)
        return released

    def unmap_runs(self, arena: Arena, runs: list[tuple[int, int]]) -> int:
        """Unmap these (first page, count) runs of `arena`; bytes released."""
        owner = self.owner
        for page, count in sorted(runs):
            owner.note_segment("segment_unmap", arena.base + (page << self.shift),
                               count << self.shift, arena.stream)
            owner.backend.unmap(arena.reservation, page << self.shift, count << self.shift)
            arena.mapped[page:page + count] = bytes(count)
        nbytes = sum(count for _, count in runs) << self.shift
        if nbytes:
            owner.on_device_memory(-nbytes, False, calls=len(runs))
        return nbytes

    def release_cached(self, streams=None, below: int | None = None, keep=()) -> int:
        return self.unmap_idle(streams)        # (`keep`: segment pools only)

    def release_stream(self, stream) -> bool:
        """Give `stream`'s arena back (pages and address range) if no block in it is allocated
        (free blocks always merge, so then it is one free block); True when it is gone."""
        arena = self.arenas.get(stream)
        if arena is None:
            return True
        whole = arena.first
        if whole.allocated or whole.size != arena.reservation.size:   # live blocks in it
            return False
        self.unmap_idle(streams={stream})
        self.owner.backend.free(arena.reservation.start, "release")
        del self.arenas[stream]
        self.owner.on_device_memory(0, False, segments=-1)
        return True

    def streams(self) -> set:
        return set(self.arenas)

    def close(self) -> None:
        """Give everything back: pages, then the address ranges (all blocks must be free)."""
        self.unmap_idle()
        for arena in self.arenas.values():
            self.owner.backend.free(arena.reservation.start, "release")
        self.arenas.clear()

    def largest_free_run(self) -> int:
        """The longest run of free bytes on mapped pages: the mapped part of some free block
        (free neighbours merge). Blocks are tried largest first, and the search stops at a
        block too small to beat the best run, so it looks at few blocks."""
        best = 0
        for arena in self.arenas.values():
            for block in arena.free.largest_first():
                if block.size <= best:
                    break
                first, end = self._pages(arena, block.start, block.size)
                for page, count in _runs(arena.mapped, 1, first, end):
                    low = max(block.start, arena.base + (page << self.shift))
                    high = min(block.end, arena.base + ((page + count) << self.shift))
                    best = max(best, high - low)
        return best

    def views(self):
        """(stream, small, blocks, mapped ranges) per arena, for reports."""
        for arena in self.arenas.values():
            runs = _runs(arena.mapped, 1, 0, len(arena.mapped))
            mapped = [(arena.base + (first << self.shift), count << self.shift) for first, count in runs]
            yield arena.stream, False, list(arena.blocks()), mapped
