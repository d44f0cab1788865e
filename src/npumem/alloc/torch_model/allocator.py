"""A model of PyTorch's caching allocator (c10's DeviceCachingAllocator, and torch_npu's
NPUCachingAllocator with `flavour="npu"`) that makes the same decisions, byte for byte.

It holds no memory: it keeps the allocator's blocks, pools and segments and reports each
segment event the real allocator would record (segment_alloc / segment_free, segment_map /
segment_unmap for expandable segments). The rules follow c10/cuda/CUDACachingAllocator.cpp:

- sizes: below 512 bytes -> 512, else up to a multiple of 512, or to a power-of-2 division
  (roundup_power2_divisions); torch_npu first adds 32 bytes (CANN's padding);
- pools: requests up to 1 MiB in the small pool (2 MiB segments), larger ones in the large pool
  (20 MiB segments below 10 MiB, else the request rounded up to 2 MiB);
- best fit on (stream, size, address); blocks of max_split_size or more serve only requests
  that are themselves that large and at most max_non_split_rounding smaller;
- split when the remainder is >= 512 bytes (small pool, expandable segments) or > 1 MiB and the
  request is below max_split_size (large pool); merge with free neighbours on free;
- a memory fraction (set_per_process_memory_fraction: c10's allowed_memory_maximum) is checked
  in alloc_block before the driver is asked: reserved bytes plus the segment the request asks
  for (get_allocation_size) must stay within it. It counts that size, never the pages an
  expandable segment then maps (2 or 20 MiB each, more than the request needs where a page is
  part-used), so reserved memory can pass the fraction by up to a page; the device itself
  (DeviceMemory) refuses only what it does not have;
- when the driver (or the fraction) refuses: free oversize cached blocks (with max_split_size),
  then every unsplit cached segment, and retry; then out of memory;
- garbage_collection_threshold acts only under a memory fraction, before a cache miss asks the
  driver: once reserved passes threshold x allowed, unsplit large blocks whose age
  (get_free_block calls since they were cached) is at least the average go, in rounds, until
  what they free covers the excess;
- expandable_segments: one growing address range per stream and pool, mapped in 2 MiB (small)
  or 20 MiB (large) pages, unmapped only by empty_cache and the out-of-memory path;
- private pools (CUDA graph captures, torch.cuda.MemPool): each has its own small and large pool,
  with its own segments (expandable ones too); a request goes to the pool of the newest capture
  or use_mem_pool context that takes its stream (get_pool), and is served from that pool only.
  A pool in use (use_count > 0) keeps its segments: empty_cache and the out-of-memory path free
  only the default pools and the released ones (graph_pools_freeable), and skip the default
  pools while a capture is under way; releasePool drops use_count, emptyCache(id) frees one
  released pool.

Cross-stream uses (record_stream) are not modelled: replays free a block when the recording
says it became reusable (free_completed).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from ...units import format_size
from .blocks import Block, BlockPool
from .config import NO_LIMIT, TorchAllocatorConfig
from .device import DeviceMemory, ExpandableSegment

MiB = 1 << 20
MIN_BLOCK = 512
SMALL_SIZE = MiB
SMALL_BUFFER = 2 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB
EXTRA_LARGE_BUFFER = 1 << 30            # torch_npu page_size:1g
DEFAULT_POOL = (0, 0)                   # MempoolId_t of the default pools


class ModelOutOfMemory(Exception):
    """The model, like the real allocator, could not serve a request."""

    def __init__(self, message: str, request: int, alloc_size: int, free: int | None,
                 reserved: int, allocated: int, largest_free: int):
        super().__init__(message)
        self.request, self.alloc_size, self.free = request, alloc_size, free
        self.reserved, self.allocated, self.largest_free = reserved, allocated, largest_free


@dataclass
class SegmentEvent:
    action: str            # segment_alloc | segment_free | segment_map | segment_unmap | oom
    addr: int
    size: int
    stream: int
    pool: tuple = DEFAULT_POOL


class PrivatePool:
    """c10's PrivatePool: the blocks of one CUDA graph pool or MemPool (`id`, a MempoolId_t)."""

    def __init__(self, pool_id: tuple):
        self.id = pool_id
        self.small = BlockPool(small=True, owner=self)
        self.large = BlockPool(small=False, owner=self)
        self.use_count = 1                     # captures, graphs and MemPools using it
        self.reserved = 0                      # its device bytes (c10 counts its cudaMallocs)


@dataclass
class ModelStats:
    reserved: int = 0
    peak_reserved: int = 0
    allocated: int = 0                    # block bytes
    peak_allocated: int = 0
    requested: int = 0
    peak_requested: int = 0
    allocations: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0
    cache_hits: int = 0
    events: list = field(default_factory=list)


def round_size(size: int, config: TorchAllocatorConfig) -> int:
    # torch_npu pads first (NPUCachingAllocator.cpp round_size l.2202, AddPadSize l.161)
    size += config.pad
    if size < MIN_BLOCK:
        return MIN_BLOCK
    divisions = config.divisions(size)
    if divisions > 1 and size > MIN_BLOCK * divisions:
        return _next_division(size, divisions)
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def _next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def out_of_memory_error(orig_size: int, alloc_size: int, free: int | None, capped: bool,
                        allocated: int, reserved: int, usable: int,
                        largest: int) -> ModelOutOfMemory:
    """What a model says of a request it could not serve: `free` the bytes left (on the device,
    or under the cap: `capped`), `usable` the largest cached block the request could have had
    (its pool's, on its stream), `largest` that of any pool."""
    where = "under the memory cap" if capped else "on the device"
    message = (f"out of memory: tried to allocate {format_size(alloc_size)} "
               f"(request {format_size(orig_size)}); {format_size(free or 0)} free {where}, "
               f"{format_size(allocated)} allocated, {format_size(reserved - allocated)} reserved "
               f"but unallocated (largest cached block the request could use "
               f"{format_size(usable)}, of any pool {format_size(largest)})")
    return ModelOutOfMemory(message, orig_size, alloc_size, free, reserved, allocated, usable)


def allowed_bytes(config: TorchAllocatorConfig, capacity: int | None,
                  allowed: int | None = None) -> int | None:
    """The bytes a memory fraction allows (c10's allowed_memory_maximum): `allowed` where they
    are known as bytes, else the config's per_process_memory_fraction of the device's
    `capacity`, as setMemoryFraction computes it; None without a fraction."""
    fraction = config.per_process_memory_fraction
    if allowed is None and fraction is not None and capacity:
        return int(fraction * capacity)
    return allowed


def expandable_groups(segments) -> dict[tuple, list]:
    """The expandable ranges of a recorded state (StartSegment-shaped) by (stream, pool, small),
    each group in address order: what one expandable segment becomes when it is restored."""
    groups: dict[tuple, list] = {}
    for segment in segments:
        if segment.expandable:
            groups.setdefault((segment.stream, segment.pool, segment.small), []).append(segment)
    return {key: sorted(ranges, key=lambda r: r.addr) for key, ranges in groups.items()}


def restored_range(ranges, capacity: int | None, segments=(), page: int = 1) -> tuple[int, int]:
    """(base, bytes of addresses) of an expandable segment rebuilt from its mapped `ranges`
    (address order, StartSegment-shaped): from the lowest address the trace maps (it may map
    below the pages mapped at its start: c10 maps the lowest room first), with room for 9/8 of
    the device, as a new one reserves, up to the next of the other `segments` at the start
    (the whole state): a reserved range never runs into another segment's addresses, where
    the model would keep two blocks at one address (the device size assumed may be larger
    than the one recorded). Whole `page`s: the segment reserves its space in pages. (A start
    state whose own pages run into the next segment is refused before it comes here:
    start_state._check_segments.)"""
    base = min([ranges[0].addr] + [r.lowest for r in ranges if r.lowest is not None])
    end = ranges[-1].addr + ranges[-1].size
    space = -(-max(address_space(capacity), end - base) // page) * page
    above = min((s.addr for s in segments if s.addr >= end), default=None)
    return base, space if above is None else min(space, (above - base) // page * page)


def expandable_page(config: TorchAllocatorConfig, small: bool) -> int:
    """The granule an expandable segment of the small or the large pool maps in
    (torch_npu: NPUCachingAllocator.cpp l.2461-2465)."""
    if small:
        return SMALL_BUFFER
    return EXTRA_LARGE_BUFFER if config.page_size_1g else config.expandable_large_page


def address_space(capacity: int | None) -> int:
    """The addresses an expandable segment reserves: 9/8 of the device (c10; torch_npu
    NPUCachingAllocator.cpp l.369); 1 TiB where the device has no limit."""
    capacity = capacity or (1 << 40)
    return capacity + capacity // 8


class TorchAllocatorModel:
    """The allocator of one device. `malloc` returns a Block (its `addr` is the pointer),
    `free` takes it back; `stats.events` lists the segment events in order."""

    def __init__(self, config: TorchAllocatorConfig | None = None,
                 device: DeviceMemory | None = None, allowed: int | None = None):
        """`allowed`: the bytes a memory fraction allows (c10's allowed_memory_maximum), where
        they are known as bytes; else the config's per_process_memory_fraction of the device's
        capacity, as setMemoryFraction computes it."""
        self.config = config or TorchAllocatorConfig()
        self.device = device or DeviceMemory()
        self.small = BlockPool(small=True)
        self.large = BlockPool(small=False)
        self.pools: dict[tuple, PrivatePool] = {}       # graph_pools
        self.freeable: dict[tuple, PrivatePool] = {}    # graph_pools_freeable: use_count 0
        self.captures: list[tuple] = []                 # captures_underway: (id, streams)
        self.stats = ModelStats()
        self.active: set[Block] = set()          # allocated blocks
        self.expandable: list[ExpandableSegment] = []
        self.allowed = allowed_bytes(self.config, self.device.capacity, allowed)
        self.total_allocated = 0                  # what the driver gave: reserved bytes

    # --- the public calls ------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        config = self.config
        size = round_size(orig_size, config)
        pool = self._get_pool(size, stream)
        alloc_size = self.allocation_size(size)
        block = self._get_free_block(pool, size, stream)
        if block is not None:
            self.stats.cache_hits += 1
        else:
            if self._collects():
                self._garbage_collect()
            block = (self._alloc_block(pool, size, alloc_size, stream, retry=False)
                     or (self._release_available(pool, size, stream)
                         and self._alloc_block(pool, size, alloc_size, stream, retry=False))
                     or (not self.captures and self.release_cached()
                         and self._alloc_block(pool, size, alloc_size, stream, retry=True)))
            if not block:
                raise self._out_of_memory(orig_size, size, alloc_size, stream, pool)
        if config.flavour == "npu":
            block = self._align_start(block, size)
        return self._alloc_found_block(block, size, orig_size, stream, self._should_split(block, size))

    def free(self, block: Block) -> None:
        if not block.allocated:
            raise ValueError(f"{block} is not allocated")
        block.allocated = False
        self.active.discard(block)
        stats = self.stats
        stats.allocated -= block.size
        stats.requested -= block.requested
        stats.allocations -= 1
        self._free_block(block)

    def would_reuse(self, orig_size: int, stream: int = 0) -> bool:
        """Whether malloc would serve this request from a cached block (changes nothing)."""
        size = round_size(orig_size, self.config)
        pool = self._get_pool(size, stream)
        calls = pool.free_block_calls
        block = self._get_free_block(pool, size, stream)
        pool.free_block_calls = calls
        if block is None:
            return False
        pool.insert(block)
        return True

    def empty_cache(self, pool_id: tuple = DEFAULT_POOL) -> None:
        """torch.cuda.empty_cache(), or with a pool's id what deleting its MemPool does."""
        self.release_cached(pool_id)

    def release_cached(self, pool_id: tuple = DEFAULT_POOL) -> bool:
        """Give unsplit cached blocks back to the driver (release_cached_blocks): with the
        default id those of the default pools (unless a capture is under way) and of every
        released private pool; with a pool's id, that pool's, if it was released."""
        if pool_id == DEFAULT_POOL and not self.captures:
            self._release_blocks(self.large)
            self._release_blocks(self.small)
        for released_id, private in list(self.freeable.items()):
            if pool_id not in (DEFAULT_POOL, released_id):
                continue
            self._release_blocks(private.small)
            self._release_blocks(private.large)
            if private.reserved == 0:           # nothing left of it: c10 forgets the pool
                del self.pools[released_id], self.freeable[released_id]
        return True

    # --- private pools (CUDA graphs, MemPool) -------------------------------------------------
    def create_pool(self, pool_id: tuple) -> PrivatePool:
        """MemPool() or a capture starting on `pool_id` (createOrIncrefPool): a new pool, or one
        more use of a live one."""
        private = self.pools.get(pool_id)
        if private is None:
            private = self.pools[pool_id] = PrivatePool(pool_id)
        elif private.use_count == 0:
            raise ValueError(f"pool {pool_id} was released")
        else:
            private.use_count += 1
        return private

    def begin_allocate_to_pool(self, pool_id: tuple, streams=None) -> None:
        """A capture (`streams`: the captured ones) or use_mem_pool (None: every stream) routes
        requests to `pool_id` until end_allocate_to_pool (beginAllocateToPool)."""
        if any(underway == pool_id for underway, _ in self.captures):
            raise ValueError(f"already allocating to pool {pool_id}")
        self.create_pool(pool_id)
        self.captures.append((pool_id, None if streams is None else frozenset(streams)))

    def end_allocate_to_pool(self, pool_id: tuple) -> None:
        for position, (underway, _) in enumerate(self.captures):
            if underway == pool_id:
                del self.captures[position]
                return
        raise ValueError(f"not allocating to pool {pool_id}")

    def release_pool(self, pool_id: tuple) -> None:
        """A graph reset, a MemPool deleted or use_mem_pool's exit (releasePool): one use less;
        at none the pool's cached segments may go back to the driver."""
        private = self.pools[pool_id]
        if private.use_count == 0:
            raise ValueError(f"pool {pool_id} was already released")
        private.use_count -= 1
        if private.use_count == 0:
            self.freeable[pool_id] = private

    def release_fully(self, pool_id: tuple) -> None:
        """Every use of a private pool released, and it the last of the released pools (a
        replay's doing: c10 frees released pools in its hash map's order, which only the
        recording shows). Nothing for a pool not held."""
        private = self.pools.get(pool_id)
        if private is None:
            return
        private.use_count = 0
        self.freeable.pop(pool_id, None)
        self.freeable[pool_id] = private

    @contextmanager
    def routed(self, pool_id: tuple, capturing: bool = False):
        """Requests of every stream go to `pool_id` meanwhile, its use count untouched, and with
        `capturing` a capture is under way: how a replay makes a recorded request where and
        when the real allocator did."""
        if pool_id == DEFAULT_POOL and not capturing:
            yield
            return
        if pool_id != DEFAULT_POOL and pool_id not in self.pools:
            self.pools[pool_id] = PrivatePool(pool_id)
        # a default request during a capture: as under a capture that takes no stream
        underway = (pool_id, frozenset() if pool_id == DEFAULT_POOL else None)
        self.captures.append(underway)
        try:
            yield
        finally:
            self.captures.remove(underway)

    def _get_pool(self, size: int, stream: int) -> BlockPool:
        """The newest capture that takes this stream decides the pool (get_pool)."""
        for pool_id, streams in reversed(self.captures):
            if streams is None or stream in streams:
                private = self.pools[pool_id]
                return private.small if size <= SMALL_SIZE else private.large
        return self.small if size <= SMALL_SIZE else self.large

    def _block_pools(self):
        yield self.small
        yield self.large
        for private in self.pools.values():
            yield private.small
            yield private.large

    # --- sizes -----------------------------------------------------------------------------
    def segment_size(self, size: int) -> int:
        """The most device bytes a cache miss for a request of `size` (rounded) bytes asks
        for: a new segment, or with expandable segments the pages that map it."""
        if self.config.expandable_segments:
            page = self.expandable_page(size <= SMALL_SIZE)
            return -(-size // page) * page
        return self.allocation_size(size)

    def allocation_size(self, size: int) -> int:
        """The segment cudaMalloc is asked for on a cache miss (get_allocation_size), and what a
        memory fraction's check counts, expandable segments or not. torch_npu
        takes it from aclrtMallocAlign32, which adds nothing to it (NPUCachingAllocator.cpp
        l.3011): page_size:1g rounds the large pool's to 1 GiB (l.1194), large_segment_size_mb
        sizes the 1-10 MiB ones (l.2771; segment_size_mb does not)."""
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if self.config.page_size_1g:
            return -(-size // EXTRA_LARGE_BUFFER) * EXTRA_LARGE_BUFFER
        if size < MIN_LARGE_ALLOC:
            return self.config.large_segment_size
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    def expandable_page(self, small: bool) -> int:
        """The granule an expandable segment of the small or the large pool maps in
        (torch_npu: NPUCachingAllocator.cpp l.2461-2465)."""
        return expandable_page(self.config, small)

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.small or self.config.expandable_segments:
            return remaining >= MIN_BLOCK
        return size < self.config.max_split_size and remaining > SMALL_SIZE

    # --- finding cached blocks -------------------------------------------------------------
    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        config = self.config
        if self._collects():
            pool.free_block_calls += 1
        keys = pool.keys
        index = pool.lower_bound(stream, size)
        if index == len(keys) or keys[index][0] != stream:
            return None
        block = pool.block_at(index)
        if block.segment is not None:
            if config.expandable_segments:
                # an expandable block counts as the size it can grow to
                following = index + 1
                while (block.segment is not None and following < len(keys)
                       and keys[following][0] == stream
                       and _expandable_size(pool.block_at(following)) < _expandable_size(block)):
                    block = pool.block_at(following)
                    following += 1
            else:                                # expandable blocks from before it was turned off
                index += 1
                while (index < len(keys) and keys[index][0] == stream
                       and pool.block_at(index).segment is not None):
                    index += 1
                if index == len(keys) or keys[index][0] != stream:
                    return None
                block = pool.block_at(index)
        limit = config.max_split_size
        if size < limit <= block.size:
            return None
        if size >= limit and block.size >= size + config.max_non_split_rounding_size:
            return None
        pool.remove(block)
        return block

    # --- new memory from the driver ---------------------------------------------------------
    def _alloc_block(self, pool, size, alloc_size, stream, retry) -> Block | None:
        if retry:
            self.stats.num_alloc_retries += 1
        # the fraction counts the segment asked for; the pages an expandable segment maps for
        # it may be more, and only the device refuses them (alloc_block, then map_block)
        if self.allowed is not None and self.total_allocated + alloc_size > self.allowed:
            return None
        if self.config.expandable_segments:
            return self._allocate_expandable(pool, size, stream)
        addr = self.device.malloc(alloc_size)
        if addr is None:
            return None
        block = Block(addr, alloc_size, stream, pool)
        self._reserve(alloc_size, +1, "segment_alloc", addr, stream, pool)
        return block

    def _reserve(self, size: int, sign: int, action: str, addr: int, stream: int,
                 pool: BlockPool) -> None:
        self._hold(pool, sign * size)
        stats = self.stats
        stats.reserved += sign * size
        if stats.reserved > stats.peak_reserved:
            stats.peak_reserved = stats.reserved
        if sign > 0:
            stats.num_device_alloc += 1
        else:
            stats.num_device_free += 1
        stats.events.append(SegmentEvent(action, addr, size, stream, _pool_id(pool)))

    # --- placing a block ---------------------------------------------------------------------
    def _align_start(self, block: Block, size: int) -> Block:
        """torch_npu: in expandable segments, blocks of 2 MiB or more start on
        base_addr_aligned_kb; the bytes skipped stay free in the pool (NPUCachingAllocator.cpp
        malloc, l.1397-1420)."""
        align = self.config.base_addr_aligned_kb * 1024
        if not (size >= ROUND_LARGE and self.config.expandable_segments and align
                and block.addr % align):
            return block
        offset = align - block.addr % align
        if offset + size > block.size:
            return block
        aligned = Block(block.addr + offset, block.size - offset, stream=block.stream,
                        pool=block.pool, segment=block.segment)
        aligned.splice(block, block.next)
        block.size = offset
        block.pool.insert(block)
        return aligned

    def _alloc_found_block(self, block: Block, size: int, orig_size: int, stream: int,
                           split: bool) -> Block:
        pool = block.pool
        if split:
            remaining = block
            block = Block(remaining.addr, size, stream, pool, segment=remaining.segment)
            block.splice(remaining.prev, remaining)
            remaining.addr += size
            remaining.size -= size
            pool.insert(remaining)
        block.allocated = True
        block.requested = orig_size
        self.active.add(block)
        stats = self.stats
        stats.allocations += 1
        stats.allocated += block.size
        stats.requested += orig_size
        if stats.allocated > stats.peak_allocated:
            stats.peak_allocated = stats.allocated
        if stats.requested > stats.peak_requested:
            stats.peak_requested = stats.requested
        return block

    def _free_block(self, block: Block) -> None:
        pool = block.pool
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        pool.insert(block)

    def _try_merge(self, dst: Block, src: Block | None) -> int:
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src.mapped:
            src.pool.remove(src)
        else:
            src.pool.remove_unmapped(src)
        return src.size

    # --- expandable segments ---------------------------------------------------------------
    def _find_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block:
        for candidate in pool.unmapped_from(stream):
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev
            room, walker = 0, candidate
            while room < size and walker is not None and not walker.allocated:
                room += walker.size
                walker = walker.next
            if room >= size:
                return candidate
        page = self.expandable_page(pool.small)
        segment = ExpandableSegment(self.device, stream, page, address_space(self.device.capacity))
        self.expandable.append(segment)
        candidate = segment.whole(pool, stream)
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, block: Block, size: int) -> bool:
        start, mapped = block.segment.map(block.addr, size)
        if mapped == 0:
            return False
        pool = block.pool
        pool.remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.stream, pool,
                         segment=block.segment, mapped=False)
            rest.splice(block, block.next)
            pool.insert_unmapped(rest)
            block.size = mapped
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        pool.insert(block)
        self._reserve(mapped, +1, "segment_map", start, block.stream, pool)
        return True

    def _allocate_expandable(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        candidate = self._find_expandable_block(pool, size, stream)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            if following is None:          # larger than the address space: more than the device
                return None
            if not self._map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _unmap_block(self, block: Block) -> None:
        start, unmapped = block.segment.unmap(block.addr, block.size)
        if unmapped == 0:
            return
        pool = block.pool
        pool.remove(block)
        before = start - block.addr
        if before > 0:
            head = Block(block.addr, before, block.stream, pool, segment=block.segment)
            head.splice(block.prev, block)
            pool.insert(head)
        after = block.size - before - unmapped
        if after > 0:
            tail = Block(start + unmapped, after, block.stream, pool, segment=block.segment)
            tail.splice(block, block.next)
            pool.insert(tail)
        block.addr, block.size, block.mapped = start, unmapped, False
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        pool.insert_unmapped(block)
        self._reserve(unmapped, -1, "segment_unmap", start, block.stream, pool)

    # --- giving memory back -----------------------------------------------------------------
    def _release_block(self, block: Block) -> None:
        self.device.free(block.addr, block.size)
        block.pool.remove(block)
        self._reserve(block.size, -1, "segment_free", block.addr, block.stream, block.pool)

    def _release_blocks(self, pool: BlockPool) -> None:
        to_unmap = []
        for stream, size, addr in list(pool.keys):
            block = pool.by_addr.get(addr)
            if block is None:
                continue
            if block.segment is not None:
                to_unmap.append(block)
            elif not block.is_split:
                self._release_block(block)
        for block in to_unmap:
            self._unmap_block(block)
            if not block.is_split and not block.mapped:
                pool.remove_unmapped(block)
                block.segment.release()
                self.expandable.remove(block.segment)

    def oversize_release(self, orig_size: int, stream: int = 0, dry_run: bool = False) -> list[int]:
        """Addresses of the cached blocks the out-of-memory retry frees first for this request
        (release_available_cached_blocks); `dry_run` changes nothing."""
        size = round_size(orig_size, self.config)
        pool = self._get_pool(size, stream)
        blocks, _ = self._oversize_blocks(pool, size, stream)
        if not dry_run:
            for block in blocks:
                self._release_block(block)
        return [block.addr for block in blocks]

    def _release_available(self, pool: BlockPool, size: int, stream: int) -> bool:
        blocks, enough = self._oversize_blocks(pool, size, stream)
        for block in blocks:                  # freed even when they are not enough, as in c10
            self._release_block(block)
        return enough

    def _oversize_blocks(self, pool: BlockPool, size: int, stream: int) -> tuple[list[Block], bool]:
        """The oversize cached blocks to free for `size`: the best fit at or above
        max(size, max_split_size), else the largest ones, largest first, until they add up."""
        limit = self.config.max_split_size
        if limit == NO_LIMIT:
            return [], False
        wanted = max(size, limit)
        keys = pool.keys
        index = pool.lower_bound(stream, wanted)
        if index < len(keys) and keys[index][0] == stream:
            block = pool.block_at(index)
            return ([], False) if block.segment is not None else ([block], True)
        chosen, released = [], 0
        index -= 1
        while released < wanted and index >= 0 and keys[index][0] == stream:
            block = pool.block_at(index)
            if block.size < limit or block.segment is not None:
                break
            chosen.append(block)
            released += block.size
            index -= 1
        return chosen, released >= wanted

    def _collects(self) -> bool:
        """Whether garbage collection is on: a threshold, under a memory fraction."""
        return self.allowed is not None and self.config.garbage_collection_threshold > 0

    def collected(self, orig_size: int, stream: int = 0) -> list[int]:
        """Addresses of the cached segments this request's garbage collection frees, in the
        order it frees them: none when a cached block serves it or collection is off or not
        due (changes nothing)."""
        if not self._collects() or self.would_reuse(orig_size, stream):
            return []
        return [block.addr for block in self._collectable()]

    def _garbage_collect(self) -> None:
        """Free old unsplit large blocks once reserved memory passes the threshold."""
        for block in self._collectable():
            self._release_block(block)

    def _collectable(self) -> list[Block]:
        """What garbage_collect_cached_blocks frees, in its order: rounds over the large pool
        (in its order), each freeing every unsplit cudaMalloc'd block at least as old as the
        average of those left (expandable ones count in the average, never go), until what is
        freed covers the excess over the threshold or a round frees nothing."""
        threshold = int(self.config.garbage_collection_threshold * self.allowed)
        if self.total_allocated <= threshold:
            return []
        target = self.total_allocated - threshold
        pool = self.large
        unsplit = [block for block in (pool.block_at(i) for i in range(len(pool.keys)))
                   if not block.is_split]
        ages = {id(block): pool.free_block_calls - block.gc_base for block in unsplit}
        total_age, count = sum(ages.values()), len(unsplit)
        chosen: list[Block] = []
        taken: set[int] = set()
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            average = total_age / count
            freed = False
            for block in unsplit:
                age = ages[id(block)]
                if id(block) in taken or block.segment is not None or age < average:
                    continue
                freed = True
                reclaimed += block.size
                total_age -= age
                count -= 1
                taken.add(id(block))
                chosen.append(block)
        return chosen

    # --- out of memory ----------------------------------------------------------------------
    def largest_free(self) -> int:
        return max((key[1] for pool in self._block_pools() for key in pool.keys), default=0)

    def _out_of_memory(self, orig_size: int, size: int, alloc_size: int, stream: int,
                       pool: BlockPool):
        stats = self.stats
        stats.num_ooms += 1
        free = self.device.free_bytes()
        if self.allowed is not None:
            free = max(0, min(free if free is not None else self.allowed,
                              self.allowed - self.total_allocated))
        stats.events.append(SegmentEvent("oom", free or 0, size, stream, _pool_id(pool)))
        # the cached blocks the request could have had: its pool's, on its stream
        usable = max((key[1] for key in pool.keys if key[0] == stream), default=0)
        return out_of_memory_error(orig_size, alloc_size, free, self.allowed is not None,
                                   stats.allocated, stats.reserved, usable, self.largest_free())

    # --- state ------------------------------------------------------------------------------
    def restore(self, segments) -> dict[int, Block]:
        """Start from a recorded state (StartSegment-shaped: addr, size, stream, small,
        expandable, pool, lowest, blocks of addr, size, requested, allocated). Returns the live
        blocks by address. Expandable ranges of one stream and pool become one expandable
        segment, from the lowest address the trace maps; a private pool met here is in use."""
        live: dict[int, Block] = {}
        for segment in segments:
            if not segment.expandable:
                pool = self._pool_for(segment.pool, segment.small)
                self.device.claim(segment.addr, segment.size)
                self._restore_blocks(segment.blocks, segment.stream, pool, None, live)
                self._hold(pool, segment.size)
        for (stream, pool_id, small), ranges in expandable_groups(segments).items():
            self._restore_expandable(stream, self._pool_for(pool_id, small), ranges, live,
                                     segments)
        stats = self.stats
        stats.reserved = stats.peak_reserved = self.total_allocated
        stats.peak_allocated, stats.peak_requested = stats.allocated, stats.requested
        return live

    def _pool_for(self, pool_id: tuple, small: bool) -> BlockPool:
        if pool_id == DEFAULT_POOL:
            return self.small if small else self.large
        private = self.pools.get(pool_id) or self.create_pool(pool_id)
        return private.small if small else private.large

    def _hold(self, pool: BlockPool, size: int) -> None:
        """`size` device bytes more (or fewer) held: in all, and by a private pool."""
        self.total_allocated += size
        if pool.owner is not None:
            pool.owner.reserved += size

    def _restore_blocks(self, blocks, stream, pool, segment, live, before=None) -> Block | None:
        previous = before
        for item in blocks:
            block = Block(item.addr, item.size, stream, pool, segment=segment)
            block.splice(previous, None)
            if item.allocated:
                block.allocated, block.requested = True, item.requested
                self.active.add(block)
                live[item.addr] = block
                self.stats.allocations += 1
                self.stats.allocated += block.size
                self.stats.requested += item.requested
            else:
                pool.insert(block)
            previous = block
        return previous

    def _restore_expandable(self, stream: int, pool: BlockPool, ranges, live, segments) -> None:
        page = self.expandable_page(pool.small)
        base, space = restored_range(ranges, self.device.capacity, segments, page)
        segment = ExpandableSegment(self.device, stream, page, space, base=base)
        self.expandable.append(segment)
        previous, cursor = None, base
        for mapped in ranges:
            if mapped.addr > cursor:
                previous = self._unmapped(segment, pool, stream, cursor, mapped.addr - cursor, previous)
            segment.mark_mapped(mapped.addr, mapped.size)
            self._hold(pool, mapped.size)
            previous = self._restore_blocks(mapped.blocks, stream, pool, segment, live, previous)
            cursor = mapped.addr + mapped.size
        if cursor < base + segment.size:
            self._unmapped(segment, pool, stream, cursor, base + segment.size - cursor, previous)

    def _unmapped(self, segment, pool, stream, addr, size, previous) -> Block:
        block = Block(addr, size, stream, pool, segment=segment, mapped=False)
        block.splice(previous, None)
        pool.insert_unmapped(block)
        return block

    def segment_list(self) -> list[dict]:
        """Segments (each contiguous mapped range of an expandable segment counts as one),
        with their blocks, in address order: the shape of a snapshot's `segments`."""
        heads = [block for block in self._all_blocks()
                 if block.mapped and (block.prev is None or not block.prev.mapped)]
        out = []
        for head in sorted(heads, key=lambda b: b.addr):
            blocks, block = [], head
            while block is not None and block.mapped:
                blocks.append({"address": block.addr, "size": block.size,
                               "requested_size": block.requested if block.allocated else 0,
                               "state": "active_allocated" if block.allocated else "inactive"})
                block = block.next
            out.append({"address": head.addr, "total_size": sum(b["size"] for b in blocks),
                        "stream": head.stream,
                        "segment_type": "small" if head.pool.small else "large",
                        "segment_pool_id": _pool_id(head.pool),
                        "is_expandable": head.segment is not None, "blocks": blocks})
        return out

    def _all_blocks(self):
        seen = set()
        starts = list(self.active)
        for pool in self._block_pools():
            starts += list(pool.unmapped.values()) + list(pool.by_addr.values())
        for block in starts:
            while block.prev is not None:
                block = block.prev
            yield from _chain(block, seen)


def _chain(head: Block, seen: set):
    block = head
    while block is not None:
        if id(block) in seen:
            return
        seen.add(id(block))
        yield block
        block = block.next


def _pool_id(pool: BlockPool) -> tuple:
    return DEFAULT_POOL if pool.owner is None else pool.owner.id


def _expandable_size(block: Block) -> int:
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)
