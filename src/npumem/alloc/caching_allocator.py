"""The caching pool: what npumem tensors and workspaces allocate from.

`CachingAllocator` is a MemoryResource over one device of a backend. It rounds each request by
the carving rules, finds a cached block (first fit in expandable arenas, best fit in segments;
reused at once on the stream that freed it), and asks the device for more only when nothing
cached fits — through one of two strategies:

- expandable (default; `expandable.py`): an address range per stream, 2 MiB pages mapped on
  demand and unmapped once unused and their stream idle;
- segments (`expandable_segments:False`; `segments.py`): PyTorch's policy of cached segments.

When the device is full it frees what it caches (after the streams using it are done), retries,
and then raises OutOfMemoryError with the numbers and a concrete hint. A block also used on other
streams (`record_stream`) is reused only after events recorded on those streams at free time
have completed.
"""

from __future__ import annotations

import collections
import itertools
from bisect import bisect_right
import threading

from ..constants import MemAttr
from ..device.backend import DeviceBackend
from ..errors import InvalidParamError, MemoryAllocationError, MemoryFreeError
from ..observe import OBSERVERS, emit
from ..units import format_size
from .block import Block
from .predictive import Predictor
from .expandable import ExpandableStrategy
from .resource import MemoryResource
from .segments import SegmentStrategy
from .settings import AllocatorSettings
from .sizes import MIN_BLOCK, SMALL_SIZE, round_request
from .stats import POOLS, PoolStats, Stat


class OutOfMemoryError(MemoryAllocationError):
    """The pool could not serve a request even after releasing its cache. `requested` and
    `capacity` (the bytes the pool may hold) let a caller word its own advice."""

    requested = capacity = 0


def _always_idle(stream) -> bool:
    return True


def _snapshot(block: Block) -> Block:
    """A detached copy of an allocated block, for reports."""
    copy = Block(block.start, block.size, block.segment)
    copy.requested, copy.small, copy.allocated = block.requested, block.small, True
    return copy


class CachingAllocator(MemoryResource):
    """Caching pool with split/merge, stream-ordered reuse and PyTorch-style stats.

    `stream_idle(stream)`, `synchronize(stream)` and `record_event(stream)` connect it to real
    streams (the runtime's); by default every stream counts as idle, as in trace replay.
    """

    def __init__(self, backend: DeviceBackend, device: int = 0,
                 settings: AllocatorSettings | None = None, *, flavour: str = "npu",
                 stream_idle=_always_idle, synchronize=None, record_event=None):
        if flavour not in ("npu", "torch"):
            raise InvalidParamError(f"unknown size flavour {flavour!r}; use 'npu' or 'torch'")
        self.backend, self.device, self.flavour = backend, device, flavour
        self.settings = settings or AllocatorSettings()
        self.stream_idle = stream_idle
        self._synchronize = synchronize or (lambda stream: None)
        self._record_event = record_event
        self.lock = threading.RLock()
        self.stats = PoolStats(self.lock)
        self._count_alloc, self._count_free = self.stats.alloc, self.stats.free   # hot path's
        self.capacity = self._device_memory()[1]
        self.limit = int(self.capacity * self.settings.per_process_memory_fraction)
        self._allocated: dict[int, Block] = {}
        self._other_streams: dict[int, set] = {}      # record_stream: block start -> streams
        self._pending: list[tuple[Block, list]] = []  # freed blocks waiting for those streams
        self._deferred: collections.deque[int] = collections.deque()   # see deallocate_soon
        self._gone_streams: set = set()     # destroyed streams whose arenas still hold blocks
        self._closing = False
        self._strategy = self._make_strategy()
        self._take = self._strategy.take       # bound once: the hot path's lookup
        self._predictor: Predictor | None = None
        self.settings = self.settings        # with the strategy in place: start prediction

    @property
    def settings(self) -> AllocatorSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: AllocatorSettings) -> None:
        self._settings = settings
        if hasattr(self, "_predictor"):
            if settings.predictive and self._predictor is None:
                self._predictor = Predictor(self)
            elif not settings.predictive and self._predictor is not None:
                self._predictor.retire()
                self._predictor = None
        # what the hot path needs from the settings, worked out once
        self.split_min = max(MIN_BLOCK[self.flavour], settings.block_alignment)
        limit = settings.max_split_size_mb      # max_split_size_mb in bytes (segment mode)
        self.max_split_bytes = None if limit is None else int(limit * (1 << 20))
        self._plain_rounding = self.flavour == "npu" and settings.block_alignment == 64 and \
            settings.roundup_power2_divisions <= 1

    def _make_strategy(self):
        if self.settings.expandable_segments and self.backend.supports_virtual_memory:
            return ExpandableStrategy(self)
        return SegmentStrategy(self)

    @property
    def predictor(self) -> Predictor | None:
        """The predictive part (settings.predictive), or None."""
        return self._predictor

    @property
    def expandable(self) -> bool:
        return self._strategy.expandable

    # --- the hot path --------------------------------------------------------------------
    # allocate and deallocate are written flat (explicit acquire/release, inlined rounding):
    # a cache-hit pair is a few microseconds of Python and every call level shows.

    def allocate(self, nbytes: int, stream=None) -> int:
        if nbytes < 0:
            raise InvalidParamError(f"allocate: size must not be negative, got {nbytes}")
        if self._plain_rounding:        # the carving rule, ALIGN_UP(len, 32) + 32, to 64 bytes
            size = (((nbytes + 31) & -32) + 95) & -64
        else:
            settings = self.settings
            size = round_request(nbytes, self.flavour, settings.roundup_power2_divisions,
                                 settings.block_alignment)
        lock = self.lock
        lock.acquire()
        try:
            if self._deferred:
                self._free_deferred()
            pending = self._pending
            if pending:
                self._free_completed_pending()
            predictor = self._predictor
            if predictor is None:
                block = self._take(size, stream)
            else:
                if predictor.requests < predictor.rest_until:     # paused: only counted
                    predictor.requests += 1
                    block = None
                else:
                    block = predictor.take(nbytes, size, stream)
                if block is None:
                    block = self._take(size, stream)
            if block is None:
                block = self._retry_after_releasing_cache(nbytes, size, stream)
            start = block.start
            block.allocated = True
            block.requested = nbytes
            block.small = small = size <= SMALL_SIZE
            self._allocated[start] = block
            self._count_alloc(block.size, nbytes, small)
            if pending:
                self.stats.note_active_peak()
            if OBSERVERS.active:
                for observer in OBSERVERS.active:
                    observer.on_memory(self, "alloc", self.device, start, block.size, nbytes, stream)
            if predictor is not None and predictor.learner is not None:
                predictor.learn(start, nbytes, size, stream)
            return start
        finally:
            lock.release()

    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        lock = self.lock
        lock.acquire()
        try:
            if nbytes is None:
                block = self._allocated.pop(pointer, None)
                if block is None:
                    raise MemoryFreeError(
                        f"deallocate(0x{pointer:x}): {self._explain_unknown(pointer)}")
            else:
                block = self._allocated.get(pointer)
                if block is None:
                    raise MemoryFreeError(
                        f"deallocate(0x{pointer:x}): {self._explain_unknown(pointer)}")
                if nbytes != block.requested:
                    raise InvalidParamError(f"deallocate(0x{pointer:x}, {nbytes}): the block was "
                                            f"allocated for {block.requested} bytes")
                del self._allocated[pointer]
            predictor = self._predictor
            if predictor is not None and predictor.learner is not None:
                predictor.learn_free(pointer, block.stream)
            self._count_free(block.size, block.requested, block.small)
            if self._other_streams:
                streams = self._other_streams.pop(pointer, None)
                if streams and self._record_event is not None:
                    self._pending.append((block, [self._record_event(s) for s in streams]))
                    self._count_pending(block, +1)
                    if OBSERVERS.active:
                        self._observe("free_requested", block)
                    return
            if OBSERVERS.active:          # before the block merges with its neighbours
                self._observe("free", block)
            block.allocated = False
            block.segment.free.merge_and_add(block)
            if predictor is not None and predictor.arena is not None and predictor.arena.awaited:
                predictor.awaited_free(pointer)  # the plan may claim the bytes it held
            if self._gone_streams:               # empty but for destroyed streams' last blocks
                self._release_gone({block.segment.stream} & self._gone_streams)
        finally:
            lock.release()

    def deallocate_soon(self, pointer: int) -> None:
        """A free that never waits for the pool: for finalizers, which run wherever the last
        reference dies, a stream worker finishing a task included. Done now when the pool is
        free; otherwise queued, and done by the thread holding the pool before it allocates or
        gives cache back. (Waiting instead deadlocks: `empty_cache` and the out-of-memory retry
        hold the pool while they wait for the streams, whose worker would wait here.)"""
        if self.lock.acquire(blocking=False):
            try:
                if pointer in self._allocated:
                    self.deallocate(pointer)
            finally:
                self.lock.release()
        else:
            self._deferred.append(pointer)

    def _free_deferred(self) -> None:
        """Do the frees `deallocate_soon` queued (call with the lock held)."""
        deferred = self._deferred
        while deferred:
            pointer = deferred.popleft()
            if pointer in self._allocated:          # not freed since by its device's release
                self.deallocate(pointer)

    def _count_pending(self, block: Block, sign: int) -> None:
        self.stats.add("pending", block.small, sign)
        self.stats.add("pending_bytes", block.small, sign * block.size)

    def _free_completed_pending(self, wait: bool = False) -> None:
        """Release pending blocks whose events completed (all of them with `wait`)."""
        still = []
        for block, events in self._pending:
            if wait or all(event.query() for event in events):
                self._count_pending(block, -1)
                if OBSERVERS.active:
                    self._observe("free_completed", block)
                block.allocated = False
                block.segment.free.merge_and_add(block)
            else:
                still.append((block, events))
        self._pending = still

    def _explain_unknown(self, pointer: int) -> str:
        for block in self._allocated.values():
            if block.start < pointer < block.end:
                return f"points {pointer - block.start} bytes into a {block.size}-byte block at " \
                       f"0x{block.start:x}; deallocate takes the start address"
        return "not allocated from this pool (double free, or memory from another allocator)"

    # --- out of memory -------------------------------------------------------------------

    def _retry_after_releasing_cache(self, nbytes: int, size: int, stream):
        self.stats.counters["num_alloc_retries"] += 1
        self._release_cache()
        block = self._strategy.take(size, stream)
        if block is not None:
            return block
        self.stats.counters["num_ooms"] += 1
        if OBSERVERS.active:      # an oom event carries the device's free bytes as its address
            free = self._device_memory()[0]
            emit(self, "oom", self.device, free, size, nbytes, stream)
        error = OutOfMemoryError(self.oom_message(nbytes))
        error.requested, error.capacity = nbytes, self.limit
        raise error

    def _release_cache(self) -> int:
        """Finish every stream's work, then give all cached memory back to the device."""
        for stream in self._strategy.streams():
            self._synchronize(stream)
        self.stats.counters["num_sync_all_streams"] += 1
        self._free_deferred()          # what the streams' last tasks dropped while we waited
        self._free_completed_pending()
        released = self._predictor.release_if_idle() if self._predictor is not None else 0
        released += self._strategy.release_cached()
        self._release_gone(list(self._gone_streams))    # emptied by pending frees just now
        return released

    def _device_memory(self) -> tuple[int, int]:
        """(free, total) bytes of the device: its HBM, or its DDR where it has no HBM."""
        free, total = self.backend.mem_info(self.device, MemAttr.HBM_MEM)
        if not total:
            free, total = self.backend.mem_info(self.device, MemAttr.DDR_MEM)
        return free, total

    def oom_message(self, nbytes: int) -> str:
        free, total = self._device_memory()
        allocated = self.stats.current("allocated_bytes")
        reserved = self.stats.current("reserved_bytes")
        unallocated = reserved - allocated
        if nbytes > total:
            return (f"NPU out of memory. Tried to allocate {format_size(nbytes)} ({nbytes} bytes), "
                    f"more than device {self.device}'s whole capacity of {format_size(total)}: no "
                    "amount of freeing helps; split the work into smaller pieces, or use a device "
                    "with more memory (NPUMEM_SIM_MEMORY sets the simulated NPU's).")
        if self.limit < total and reserved + nbytes > self.limit:
            hint = (f"The per-process memory fraction caps this pool at {format_size(self.limit)}; "
                    "raise it with npumem.memory.set_per_process_memory_fraction().")
        elif not self.expandable and unallocated > nbytes // 4:
            hint = ("Reserved but unallocated memory is large: set "
                    "NPUMEM_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
        else:
            hint = ("Free tensors you no longer need (check for leaks with npumem's tracker) or "
                    "reduce the batch size.")
        return (f"NPU out of memory. Tried to allocate {format_size(nbytes)}. Device {self.device} "
                f"has a total capacity of {format_size(total)} of which {format_size(free)} is free. "
                f"Of the allocated memory {format_size(allocated)} is allocated by npumem, and "
                f"{format_size(unallocated)} is reserved by npumem but unallocated. {hint}")

    # --- device memory bookkeeping (called by the strategies) ------------------------------

    def on_device_memory(self, nbytes: int, small: bool, segments: int = 0, calls: int = 1) -> None:
        if nbytes:
            self.stats.add("reserved_bytes", small, nbytes)
            key = "num_device_alloc" if nbytes > 0 else "num_device_free"
            self.stats.counters[key] += abs(calls)
        if segments:
            self.stats.add("segment", small, segments)

    def note_segment(self, action: str, address: int, size: int, stream) -> None:
        """Tell observers about device memory taken or given back (segment_alloc / segment_free,
        or segment_map / segment_unmap for expandable arenas)."""
        if OBSERVERS.active:
            emit(self, action, self.device, address, size, 0, stream)

    def _observe(self, action: str, block: Block) -> None:
        if not self._closing:
            for observer in OBSERVERS.active:
                observer.on_memory(self, action, self.device, block.start, block.size,
                                   block.requested, block.stream)

    # --- cache control -------------------------------------------------------------------

    def record_stream(self, pointer: int, stream) -> None:
        """Mark that work on `stream` uses this block: its reuse waits for that work."""
        with self.lock:
            block = self._allocated.get(pointer)
            if block is None:
                raise MemoryFreeError(f"record_stream(0x{pointer:x}): {self._explain_unknown(pointer)}")
            if stream != block.stream:
                self._other_streams.setdefault(pointer, set()).add(stream)

    def collect_pending(self) -> None:
        """Release freed blocks whose other-stream work has completed (normally done lazily,
        at the next allocate), so a report shows them free."""
        with self.lock:
            self._free_deferred()
            self._free_completed_pending()

    def forget_stream(self, stream) -> None:
        """`stream` was destroyed: its expandable arena goes back to the device as soon as no
        block in it is allocated (segment mode keeps no per-stream ranges)."""
        if hasattr(self._strategy, "release_stream"):
            with self.lock:
                self._gone_streams.add(stream)
                self._release_gone({stream})

    def _release_gone(self, streams) -> None:
        """Give back the arenas of these destroyed streams that hold no block any more."""
        for stream in streams:
            if self._strategy.release_stream(stream):
                self._gone_streams.discard(stream)

    def release_idle_cache(self, keep=()) -> int:
        """Give back what idle streams cache, waiting for none (prediction does this when its
        arena takes over and as each step begins), but the segments in `keep`; bytes
        released."""
        streams = {stream for stream in self._strategy.streams() if self.stream_idle(stream)}
        return self._strategy.release_cached(streams, keep=keep) if streams else 0

    def mark_step(self) -> None:
        """A training or serving step ended (npumem.memory.step()): what prediction learns."""
        with self.lock:
            if self._predictor is not None:
                self._predictor.mark_step()

    def empty_cache(self) -> int:
        """Give cached memory back to the device; returns the bytes released."""
        with self.lock:
            return self._release_cache()

    def set_memory_fraction(self, fraction: float) -> None:
        if not 0 < fraction <= 1:
            raise InvalidParamError(f"memory fraction must be in (0, 1], got {fraction}")
        with self.lock:
            self.settings = self.settings.replace(per_process_memory_fraction=fraction)
            self.limit = int(self.capacity * fraction)

    def owns(self, pointer: int) -> bool:
        return pointer in self._allocated

    def close(self) -> list[Block]:
        """Release everything (cached and live) to the device; returns the blocks that were
        still live (copies, as they were)."""
        with self.lock:
            self._free_deferred()
            live = list(self._allocated.values())
            report = [_snapshot(block) for block in live]    # freeing merges them: sizes change
            self._closing = True       # to profilers these stay live: their owner never freed them
            for block in live:
                # a finalizer the garbage collector runs meanwhile (a tensor's) may have freed
                # it already, and its Block may since stand for another piece
                if self._allocated.get(block.start) is block:
                    self.deallocate(block.start)
            self._closing = False
            self._free_completed_pending(wait=True)
            if self._predictor is not None:
                self._predictor.close()
            self._strategy.close()
            return report

    # --- reports --------------------------------------------------------------------------

    def fragmentation_ratio(self) -> float:
        """fragmentation()["ratio"] without walking the blocks: free bytes from the stats, the
        largest free run from the free lists. What the sampler takes at every tick."""
        with self.lock:
            if self._predictor is not None and self._predictor.arenas():
                return self.fragmentation()["ratio"]    # planned blocks sit inside pool ranges
            free = self.stats.current("reserved_bytes") - self.stats.current("allocated_bytes")
            largest = self._strategy.largest_free_run()
        return (free - largest) / free if free > 0 else 0.0

    def _mapped_pieces(self):
        """For each mapped range: (stream, small, start, length, [(block, low, high), ...]),
        the blocks cut to the part of them that lies in the range. Blocks and ranges are both
        in address order: one pass over the blocks, not one per range."""
        views = self._strategy.views()
        predictor = self._predictor
        if predictor is not None:
            views = itertools.chain(views, predictor.views())
        for stream, small, blocks, mapped in views:
            if predictor is not None:
                blocks = predictor.refine(blocks)
            starts = [block.start for block in blocks]
            for start, length in mapped:
                end = start + length
                i = max(bisect_right(starts, start) - 1, 0)
                pieces = []
                while i < len(blocks) and blocks[i].start < end:
                    block = blocks[i]
                    if block.end > start:
                        pieces.append((block, max(block.start, start), min(block.end, end)))
                    i += 1
                yield stream, small, start, length, pieces

    def memory_stats(self) -> dict[str, int | float]:
        """PyTorch-named statistics plus cache hit rate and fragmentation."""
        with self.lock:
            self._free_deferred()
            # Non-releasable ("inactive split"): free pieces of a range that also holds live blocks.
            split = {pool: Stat() for pool in POOLS}
            split_bytes = {pool: Stat() for pool in POOLS}
            for _, small, _, _, pieces in self._mapped_pieces():
                if not any(block.allocated for block, _, _ in pieces):
                    continue
                for block, low, high in pieces:
                    if not block.allocated:
                        for pool in ("all", "small_pool" if small else "large_pool"):
                            split[pool].current += 1
                            split_bytes[pool].current += high - low
            out = self.stats.flat({"inactive_split": split, "inactive_split_bytes": split_bytes})
            out["cache_hit_rate"] = self.stats.hit_rate()
            out["fragmentation"] = self.fragmentation()["ratio"]
            if self._predictor is not None:
                out.update(self._predictor.stats())
            return out

    def fragmentation(self) -> dict:
        """Free bytes in reserved memory, the largest free run, ratio = (free - largest) / free;
        for the pool and for each segment (expandable arenas: each mapped range)."""
        with self.lock:
            segments, pool_free, pool_largest = [], 0, 0
            for _, _, start, length, pieces in self._mapped_pieces():
                free = largest = run = 0
                for block, low, high in pieces:
                    run = 0 if block.allocated else run + high - low
                    free += 0 if block.allocated else high - low
                    largest = max(largest, run)
                segments.append({"address": start, "size": length, "free": free,
                                 "largest_free": largest,
                                 "ratio": (free - largest) / free if free else 0.0})
                pool_free += free
                pool_largest = max(pool_largest, largest)
            ratio = (pool_free - pool_largest) / pool_free if pool_free else 0.0
            return {"free": pool_free, "largest_free": pool_largest, "ratio": ratio,
                    "segments": segments}

    def snapshot(self) -> dict:
        """PyTorch's snapshot structure: {"segments": [...], "device_traces": [[...]]}."""
        with self.lock:
            segments = []
            pending = {block.start for block, _ in self._pending}
            for stream, small, start, length, pieces in self._mapped_pieces():
                entries = []
                for block, low, high in pieces:
                    state = "active_pending_free" if block.start in pending else \
                        "active_allocated" if block.allocated else "inactive"
                    entries.append({"address": low, "size": high - low,
                                    "requested_size": block.requested if block.allocated else 0,
                                    "state": state, "frames": []})
                segments.append({
                    "device": self.device, "address": start, "total_size": length,
                    "allocated_size": sum(e["size"] for e in entries if e["state"] == "active_allocated"),
                    "active_size": sum(e["size"] for e in entries if e["state"] != "inactive"),
                    "requested_size": sum(e["requested_size"] for e in entries),
                    "stream": getattr(stream, "handle", stream) or 0,
                    "segment_type": "small" if small else "large",
                    "is_expandable": self.expandable, "blocks": entries,
                })
            return {"segments": segments, "device_traces": [[]]}
