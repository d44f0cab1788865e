"""Segment mode: PyTorch's caching policy (also npumem's `torch` emulation for replay).

Device memory comes in segments — 2 MiB for small requests, `segment_size_mb` for requests under
10 MiB, the request rounded to 2 MiB above. Cached blocks are kept per (stream, small/large
pool) and found best-fit. Small blocks split whenever the remainder is at least the minimum
block; large blocks only when more than 1 MiB would remain. With `max_split_size_mb`, blocks that
large are never split for a smaller request. Free blocks merge with free neighbours of the same
segment; only entirely free segments go back to the device.
"""

from __future__ import annotations

from ..constants import MallocPolicy
from ..errors import MemoryAllocationError
from .block import Block, FreeList
from .sizes import LARGE_BUFFER, SMALL_SIZE, segment_size


def large_split_min(split_min: int) -> int:
    """The least rest a large block is cut for: more than a small block's worth."""
    return max(split_min, SMALL_SIZE + 1)


def usable_below(size: int, max_split_bytes: int | None) -> int | None:
    """With max_split_size_mb, the cached block size from which blocks may not serve `size`:
    blocks that large are kept for large requests, and those only take blocks at most
    LARGE_BUFFER bigger than asked (None: any block may serve)."""
    if max_split_bytes is None:
        return None
    return max_split_bytes if size < max_split_bytes else size + LARGE_BUFFER


def garbage_limit(threshold: float | None, limit: int) -> int | None:
    """garbage_collection_threshold in bytes of the pool's `limit`: above it, a miss first
    gives back free segments until reserved memory is at most this (None: no collection)."""
    return None if threshold is None else int(threshold * limit)


class Segment:
    """One device allocation carved into blocks."""

    __slots__ = ("allocation", "start", "size", "stream", "small", "free", "first")

    def __init__(self, allocation, stream, small: bool, free: FreeList):
        self.allocation = allocation
        self.start, self.size = allocation.start, allocation.size
        self.stream, self.small = stream, small
        self.free = free                    # the cache of its (stream, pool), shared by segments
        self.first = Block(self.start, self.size, self)

    def is_free(self) -> bool:
        return not self.first.allocated and self.first.next is None and self.first.size == self.size

    def blocks(self):
        block = self.first
        while block is not None:
            yield block
            block = block.next


class SegmentStrategy:
    """Cached whole segments, PyTorch style. `owner` is the CachingAllocator."""

    expandable = False

    def __init__(self, owner):
        self.owner = owner
        self.free_lists: dict[tuple, FreeList] = {}
        self.segments: dict[int, Segment] = {}

    def _free_list(self, stream, small: bool) -> FreeList:
        key = (stream, small)
        free_list = self.free_lists.get(key)
        if free_list is None:
            free_list = self.free_lists[key] = FreeList()
        return free_list

    def take(self, size: int, stream) -> Block | None:
        """A block of `size` bytes for `stream`, from the cache or a new segment."""
        small = size <= SMALL_SIZE
        free_list = self.free_lists.get((stream, small)) or self._free_list(stream, small)
        owner = self.owner
        split_min = owner.split_min if small else large_split_min(owner.split_min)
        limit = owner.max_split_bytes         # (no call on the common path: none set)
        block = free_list.take(size, split_min,
                               None if limit is None else usable_below(size, limit))
        if block is not None:
            return block
        self._collect_garbage()
        segment = self._new_segment(size, stream, small)
        if segment is None:
            return None
        block = segment.first
        if block.size - size >= split_min:
            free_list.add(block.split(size))
        self.owner.stats.counters["num_cache_misses"] += 1
        return block

    def serves_from_cache(self, size: int, stream) -> bool:
        """Whether `take(size, stream)` would find a cached block (no new segment)."""
        free_list = self.free_lists.get((stream, size <= SMALL_SIZE))
        return free_list is not None and \
            free_list.fit(size, usable_below(size, self.owner.max_split_bytes)) is not None

    def _new_segment(self, size: int, stream, small: bool, nbytes: int | None = None) -> Segment | None:
        """A new segment for a `size`-byte request (or of exactly `nbytes`); None if the
        device or the pool's limit has no room."""
        owner = self.owner
        nbytes = nbytes or segment_size(size, owner.settings.segment_size_mb)
        if owner.stats.current("reserved_bytes") + nbytes > owner.limit:
            return None
        try:
            allocation = owner.backend.allocate(owner.device, nbytes, nbytes, MallocPolicy.HUGE_FIRST,
                                                "malloc_align32")
        except MemoryAllocationError:
            return None
        allocation.pool = owner                # the sanitizer checks accesses against its blocks
        segment = Segment(allocation, stream, small, self._free_list(stream, small))
        self.segments[segment.start] = segment
        owner.on_device_memory(+nbytes, small, segments=+1)
        owner.note_segment("segment_alloc", segment.start, nbytes, stream)
        return segment

    def release_cached(self, streams=None, below: int | None = None, keep=()) -> int:
        """Return entirely free segments (of `streams`, or all) to the device, but those in
        `keep`; bytes released.

        With `below`, stop once reserved memory is at most that many bytes.
        """
        owner = self.owner
        released = 0
        for segment in sorted(self.segments.values(), key=lambda s: -s.size):
            if below is not None and owner.stats.current("reserved_bytes") <= below:
                break
            if not segment.is_free() or (streams is not None and segment.stream not in streams) \
                    or segment in keep:
                continue
            segment.free.remove(segment.first)
            del self.segments[segment.start]
            owner.note_segment("segment_free", segment.start, segment.size, segment.stream)
            owner.backend.free(segment.start, "free")
            owner.on_device_memory(-segment.size, segment.small, segments=-1)
            released += segment.size
        return released

    def _collect_garbage(self) -> None:
        limit = garbage_limit(self.owner.settings.garbage_collection_threshold, self.owner.limit)
        if limit is not None and self.owner.stats.current("reserved_bytes") > limit:
            self.release_cached(below=limit)

    def streams(self) -> set:
        return {segment.stream for segment in self.segments.values()}

    def close(self) -> None:
        """Give every segment back (all blocks must be free)."""
        self.release_cached()

    def largest_free_run(self) -> int:
        """The largest free block: free neighbours merge and a block never spans segments, so
        it is the longest free run in reserved memory."""
        return max((free.largest() for free in self.free_lists.values()), default=0)

    def views(self):
        """(stream, small, blocks, mapped ranges) per segment, for reports."""
        for segment in sorted(self.segments.values(), key=lambda s: s.start):
            yield segment.stream, segment.small, list(segment.blocks()), [(segment.start, segment.size)]
