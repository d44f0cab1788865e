"""Expandable mode (npumem's default): one growing address range per stream, pages on demand.

Each stream gets an arena: a reservation of address space as large as the device, carved best-fit
into blocks by the carving rules, with 2 MiB pages mapped under a block when it is handed out.
A page whose blocks are all free stays mapped (a reuse costs nothing), until the pool must map new
pages or `empty_cache` runs: then free pages of idle streams are unmapped first. So reserved memory
tracks the pages live blocks touch, the address range never fragments into unusable segments, and
a block freed on one stream only reaches another stream as pages, once its stream is idle.
"""

from __future__ import annotations

from array import array

from ..errors import MemoryAllocationError
from .block import Block, FreeList
from .sizes import MIN_BLOCK


class Arena:
    """The address range of one stream."""

    __slots__ = ("reservation", "base", "stream", "free", "first", "users", "mapped", "idle")

    def __init__(self, reservation, stream, page_shift: int):
        self.reservation = reservation
        self.base = reservation.start
        self.stream = stream
        self.first = Block(reservation.start, reservation.size, stream, self)
        self.free = FreeList()
        self.free.add(self.first)
        pages = reservation.size >> page_shift
        self.users = array("I", bytes(4 * pages))   # live blocks touching each page
        self.mapped = bytearray(pages)
        self.idle: set[int] = set()                 # mapped pages no live block touches

    def blocks(self):
        block = self.first
        while block is not None:
            yield block
            block = block.next


def _runs(pages):
    """Contiguous runs of sorted page numbers as (first, count)."""
    runs = []
    for page in pages:
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1][1] += 1
        else:
            runs.append([page, 1])
    return runs


class ExpandableStrategy:
    """Arenas per stream over the backend's virtual memory. `owner` is the CachingAllocator."""

    expandable = True

    def __init__(self, owner):
        self.owner = owner
        self.shift = owner.backend.page_granularity.bit_length() - 1
        self.min_block = MIN_BLOCK[owner.flavour]
        self.arenas: dict[object, Arena] = {}

    def _arena(self, stream) -> Arena:
        arena = self.arenas.get(stream)
        if arena is None:
            reservation = self.owner.backend.reserve(self.owner.device, self.owner.capacity)
            arena = self.arenas[stream] = Arena(reservation, stream, self.shift)
            self.owner.on_device_memory(0, False, segments=+1)
        return arena

    def take(self, size: int, stream) -> tuple[Block, bool] | None:
        arena = self._arena(stream)
        block = arena.free.best_fit(size)
        if block is None:
            return None
        arena.free.remove(block)
        if block.size - size >= max(self.min_block, self.owner.settings.block_alignment):
            arena.free.add(block.split(size))
        first, last = self._page_span(arena, block)   # the whole block, unsplit tail included
        users, idle, mapped = arena.users, arena.idle, arena.mapped
        for page in range(first, last + 1):       # claim the pages before anything is unmapped
            if not users[page]:
                idle.discard(page)
            users[page] += 1
        missing = [page for page in range(first, last + 1) if not mapped[page]]
        if missing and not self._map(arena, missing):
            self._unclaim(arena, first, last)
            arena.free.merge_and_add(block)
            return None
        return block, not missing

    def _page_span(self, arena: Arena, block: Block) -> tuple[int, int]:
        """First and last page a block touches."""
        return ((block.start - arena.base) >> self.shift,
                (block.start + block.size - 1 - arena.base) >> self.shift)

    def _unclaim(self, arena: Arena, first: int, last: int) -> None:
        users, idle, mapped = arena.users, arena.idle, arena.mapped
        for page in range(first, last + 1):
            users[page] -= 1
            if not users[page] and mapped[page]:
                idle.add(page)

    def _map(self, arena: Arena, pages: list[int]) -> bool:
        owner = self.owner
        self.unmap_idle(only_idle_streams=True)     # keep what is mapped close to what is live
        need = len(pages) << self.shift
        if owner.stats.current("reserved_bytes") + need > owner.limit:
            return False
        done = []
        try:
            for first, count in _runs(pages):
                owner.backend.map(arena.reservation, first << self.shift, count << self.shift)
                done.append((first, count))
        except MemoryAllocationError:
            for first, count in done:
                owner.backend.unmap(arena.reservation, first << self.shift, count << self.shift)
            return False
        for page in pages:
            arena.mapped[page] = 1
        owner.on_device_memory(+need, False, calls=len(done))
        for first, count in done:
            owner.note_segment("segment_map", arena.base + (first << self.shift), count << self.shift,
                               arena.stream)
        return True

    def give_back(self, block: Block) -> None:
        """A block's caller is done with it: release its pages' use, merge, cache."""
        arena = block.segment
        self._unclaim(arena, *self._page_span(arena, block))
        arena.free.merge_and_add(block)

    def unmap_idle(self, streams=None, only_idle_streams: bool = False) -> int:
        """Unmap mapped pages no live block touches; bytes released."""
        owner = self.owner
        released = 0
        for arena in self.arenas.values():
            if not arena.idle or (streams is not None and arena.stream not in streams):
                continue
            if only_idle_streams and not owner.stream_idle(arena.stream):
                continue
            runs = _runs(sorted(arena.idle))
            for first, count in runs:
                owner.note_segment("segment_unmap", arena.base + (first << self.shift),
                                   count << self.shift, arena.stream)
                owner.backend.unmap(arena.reservation, first << self.shift, count << self.shift)
                for page in range(first, first + count):
                    arena.mapped[page] = 0
            nbytes = len(arena.idle) << self.shift
            arena.idle.clear()
            owner.on_device_memory(-nbytes, False, calls=len(runs))
            released += nbytes
        return released

    def release_cached(self, streams=None, below: int | None = None) -> int:
        return self.unmap_idle(streams)

    def streams(self) -> set:
        return set(self.arenas)

    def close(self) -> None:
        """Give everything back: pages, then the address ranges (all blocks must be free)."""
        self.unmap_idle()
        for arena in self.arenas.values():
            self.owner.backend.free(arena.reservation.start, "release")
        self.arenas.clear()

    def views(self):
        """(stream, small, blocks, mapped ranges) per arena, for reports."""
        for arena in self.arenas.values():
            runs = _runs([page for page, on in enumerate(arena.mapped) if on])
            mapped = [(arena.base + (first << self.shift), count << self.shift) for first, count in runs]
            yield arena.stream, False, list(arena.blocks()), mapped
