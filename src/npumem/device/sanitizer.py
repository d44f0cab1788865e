"""The sanitizer inside the caching pools, at two levels (NPUMEM_SANITIZE=free | 1).

The device sanitizer (address_index) knows what the runtime's malloc handed out; a pool carves
its segments and arenas further, so a 1-byte overrun of a 100-byte block, a read after
`caching_allocator_delete` or a workspace too small for its kernel all land in memory the
device thinks is live.

`full` (NPUMEM_SANITIZE=1 or full; the test suite runs with it) indexes every pool block's
requested extent and lifetime, as an observer of the pools. Accesses inside a pool's memory must
lie inside one live block's requested bytes, and:

- queued work that resolved a block and runs after the block was freed (on another stream than
  the block's own, without `record_stream`) fails on its stream: the block may hold someone
  else's data by then;
- a tensor whose storage was freed (`Storage.free()`) and whose bytes now belong to another
  allocation is reported as stale, not read;
- `caching_allocator_delete` of a tensor's storage is refused (the tensor would free it again).

It costs a record per allocation and a lookup per access (about 3x a cache-hit pair).

`free` (NPUMEM_SANITIZE=free) records nothing per allocation: an access is checked against the
blocks the pool keeps anyway (`_allocated`, the segments' block lists), so the allocate+free
pair costs what it costs with the sanitizer off. It catches an access to a block that is free in
the pool's cache, an access running past a block's rounded size, a double free, and, through a
record per tensor storage, stale tensors and hand-freed tensor storage. It cannot tell a block
freed and handed out again from its new owner's, nor check the requested bytes inside a block
(a 1-byte overrun), nor cross-stream frees: those need `full`. docs/reliability.md has the costs.
"""

from __future__ import annotations

import collections
import os
import threading
import types
import warnings
import weakref
from bisect import bisect_right

from ..errors import InvalidParamError, MemoryAccessError
from ..units import format_size
from .address_index import AddressIndex, Allocation
from .running import running_stream



class SanitizerWarning(RuntimeWarning):
    """Misuse the sanitizer found where it cannot raise (in a finalizer)."""


class _PoolRecords:
    """One pool's live blocks, and its recently freed ones by start address (several may have
    started there: a freed block's start is often handed out again at once)."""

    REMEMBERED = 4096

    def __init__(self, pool):
        self.live = AddressIndex(remembered_frees=self.REMEMBERED)
        self.freed: dict[int, list[Allocation]] = {}
        self.order: collections.deque[Allocation] = collections.deque()
        for block in list(pool._allocated.values()):       # blocks from before it started
            self.live.add(_record(block.start, block.requested, block.size, pool.device,
                                  block.stream))

    def free(self, address: int) -> None:
        record = self.live.remove(address)
        self.freed.setdefault(address, []).append(record)
        self.order.append(record)
        if len(self.order) > self.REMEMBERED:
            oldest = self.order.popleft()
            same_start = self.freed[oldest.start]
            same_start.remove(oldest)
            if not same_start:
                del self.freed[oldest.start]

    def freed_holding(self, address: int, nbytes: int, what: str) -> Allocation | None:
        """A freed block holding the whole range that the running stream may still use: the
        block's own stream, whose queued work a free is ordered after."""
        candidates = self.freed.get(address) or [r for r in self.order
                                                 if r.start <= address < r.end]
        for record in reversed(candidates):             # the most recently freed first
            if address + nbytes <= record.end and stale_use(record, what, address, nbytes) is None:
                return record
        return None


LEVELS = {"0": "off", "1": "full", "free": "free", "full": "full"}   # NPUMEM_SANITIZE -> level


def environment_level() -> str:
    """The level NPUMEM_SANITIZE names ("off" when unset; a value not in LEVELS, which
    environment_check refuses, counts as full: whoever set it wanted checks)."""
    text = os.environ.get("NPUMEM_SANITIZE", "").strip().lower()
    return LEVELS.get(text, "full") if text else "off"


class PoolSanitizer:
    """An observer of the caching pools (see npumem.observe) that indexes their blocks (full),
    or a checker that asks the pools themselves (free)."""

    LOCK_WAIT = 0.5     # seconds a free-level check waits for a pool's lock before letting go

    def __init__(self):
        self.on = False           # any level: what the hot paths test
        self.full = False         # which level, while on
        self._lock = threading.Lock()
        self._pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pool -> records
        # the free level's: start -> live tensor storage record, pool -> sorted live starts
        self._tensors: dict[int, _TensorRecord] = {}
        self._starts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def level(self) -> str:
        return "off" if not self.on else "full" if self.full else "free"

    def _records(self, pool) -> _PoolRecords:
        with self._lock:
            records = self._pools.get(pool)
            if records is None:
                records = self._pools[pool] = _PoolRecords(pool)
            return records

    def on_memory(self, owner, action, device, address, size, requested, stream) -> None:
        if action not in ("alloc", "free", "free_completed") or not hasattr(owner, "record_stream"):
            return                             # the runtime's malloc: the device index has it
        records = self._records(owner)
        with self._lock:
            if action == "alloc":
                if records.live.get(address) is None:     # not seeded with it just now
                    records.live.add(_record(address, requested, size, device, stream))
            elif records.live.get(address) is not None:
                records.free(address)

    def on_op(self, name, device, stream, start_ns, end_ns) -> None:
        pass

    def record(self, pool, pointer: int) -> Allocation | None:
        """The live record of the block at `pointer` (None when the sanitizer is off; at the
        free level, only a tensor storage's)."""
        if not self.on:
            return None
        if self.full:
            return self._records(pool).live.get(pointer)
        record = self._tensors.get(pointer)
        return record if record is not None and record.pool is pool and record.live else None

    def tensor_record(self, pool, pointer: int, streams: set):
        """The record a tensor storage over the block at `pointer` keeps, marked as a tensor's:
        it tells the storage, once given back, from whoever gets the block next. `streams` is
        the storage's set of streams with queued work on it."""
        if not self.full:
            block = pool._allocated.get(pointer)
            if block is None:
                return None
            record = self._tensors[pointer] = _TensorRecord(pool, block, streams)
            return record
        record = self.record(pool, pointer)
        if record is not None:
            record.extra["tensor"] = True
        return record

    def given_back(self, pool, pointer: int, record) -> None:
        """A tensor storage gave its block back. At the free level its record goes stale now
        (at the full level the pool's free event does it, in stream order)."""
        if self._tensors.get(pointer) is record:
            del self._tensors[pointer]
            record.give_back()

    def check(self, rng, what: str):
        """`rng` (inside a pool's segment or arena) with the block it lies in, or
        MemoryAccessError: past the block's requested bytes, in a freed block, between blocks."""
        if not self.full:
            return self._check_free(rng, what)
        records = self._records(rng.allocation.pool)
        address = rng.allocation.start + rng.offset
        with self._lock:
            try:
                block, _ = records.live.check_range(address, rng.nbytes, what)
            except MemoryAccessError:
                # Work queued before a free on the block's own stream runs after the free, in
                # stream order, and legitimately: the bytes are reused only after it.
                block = records.freed_holding(address, rng.nbytes, what)
                if block is None:
                    raise
        return rng._replace(block=block)

    # --- the free level: answers from the pool's own blocks --------------------------------

    def _check_free(self, rng, what: str):
        """`rng` if it lies inside one live block of the pool (its rounded size), else
        MemoryAccessError naming the block, unless stream order makes the access legitimate."""
        allocation = rng.allocation
        pool = allocation.pool
        address = allocation.start + rng.offset
        end = address + rng.nbytes
        block = pool._allocated.get(address)           # the common case: a block's start
        if block is None or end > block.end:
            block = self._live_block_at(pool, address, fresh=False)
            if block is None or end > block.end:
                self._refuse(pool, address, rng.nbytes, what)
        return rng

    def _live_block_at(self, pool, address: int, fresh: bool):
        """The live block holding `address`. A sorted list of the pool's live starts is kept
        between checks: from the nearest of them below the address, a short walk along the
        block list finds blocks allocated since; a hit is verified against the pool, and the
        list is rebuilt only on a miss (or when `fresh`)."""
        allocated = pool._allocated
        starts = None if fresh else self._starts.get(pool)
        if starts is not None:
            i = bisect_right(starts, address) - 1
            block = allocated.get(starts[i]) if i >= 0 else None
            for _ in range(64):
                if block is None or block.end > address:
                    break
                block = block.next
            if block is not None and block.start <= address < block.end and \
                    allocated.get(block.start) is block:
                return block
        starts = self._starts[pool] = sorted(allocated)     # one C call: atomic under the GIL
        i = bisect_right(starts, address) - 1
        block = allocated.get(starts[i]) if i >= 0 else None
        return block if block is not None and block.start <= address < block.end else None

    def _refuse(self, pool, address: int, nbytes: int, what: str) -> None:
        """Raise for [address, address + nbytes), which is not inside one live block, unless a
        look under the pool's lock finds it legitimate."""
        if not pool.lock.acquire(timeout=self.LOCK_WAIT):
            return           # the pool is busy (maybe waiting for this very stream): let it go
        try:
            live = self._live_block_at(pool, address, fresh=True)
            if live is not None:
                if address + nbytes <= live.end:
                    return                          # allocated meanwhile
                raise MemoryAccessError(
                    f"{what}: {nbytes} bytes at 0x{address:x} run {address + nbytes - live.end} "
                    f"bytes past the end of {_describe(live, True)} (offset {address - live.start}; "
                    "NPUMEM_SANITIZE=free checks the block's rounded size, NPUMEM_SANITIZE=1 "
                    "the bytes requested)")
            block = _block_holding(pool, address)
            if block is None:
                raise MemoryAccessError(f"{what}: 0x{address:x} (+{nbytes} bytes) is in a "
                                        "caching pool's memory but in none of its blocks")
            if _stream_ordered(block):
                return
            raise MemoryAccessError(
                f"{what}: 0x{address:x} (+{nbytes} bytes) is inside {_describe(block, False)}: use "
                "after free (the pool may hand these bytes to another allocation)")
        finally:
            pool.lock.release()

    def explain_bad_free(self, pool, pointer: int) -> str | None:
        """Why `pointer`, in `pool`'s memory but not a live block's start, cannot be freed:
        a double free or an interior pointer, naming the block (None: not the pool's memory)."""
        with pool.lock:
            if self.full:
                if _block_holding(pool, pointer) is None:
                    return None
                return self._records(pool).live.explain_bad_free(
                    pointer, "caching_allocator_delete", "the caching allocator")
            live = self._live_block_at(pool, pointer, fresh=True)
            if live is not None:
                return (f"points {pointer - live.start} bytes into {_describe(live, True)}; "
                        "caching_allocator_delete takes the start address")
            block = _block_holding(pool, pointer)
            return None if block is None else f"double free: it is inside {_describe(block, False)}"


class _TensorRecord:
    """The free level's record of a tensor storage's block. It is live until the storage gives
    the block back (Storage.free(), or its last tensor dropped); after that, only to work
    running on a stream the storage had work queued on then (queued before the free, it runs
    before the pool lets another stream have the bytes: record_stream, or stream order)."""

    __slots__ = ("pool", "start", "requested", "streams", "freed")
    extra = types.MappingProxyType({"tensor": True})      # as the full level marks a tensor's

    def __init__(self, pool, block, streams: set):
        self.pool, self.start, self.requested = pool, block.start, block.requested
        self.streams, self.freed = streams, False

    def give_back(self) -> None:
        self.streams, self.freed = frozenset(self.streams), True

    @property
    def live(self) -> bool:
        if not self.freed:
            return True
        if not self.streams:
            return False
        return running_stream() in self.streams

    def describe(self) -> str:
        state = " (freed)" if self.freed else ""
        return f"pool block 0x{self.start:x} of {self.requested} bytes{state}"


def _describe(block, live: bool) -> str:
    if live:
        return f"pool block 0x{block.start:x} of {block.size} bytes ({block.requested} requested)"
    if block.allocated:
        return (f"freed pool memory at 0x{block.start:x} ({format_size(block.size)}, held for "
                "other streams' queued work or the pool's plan)")
    return (f"free pool memory at 0x{block.start:x} (a {format_size(block.size)} free run in "
            "the pool's cache)")


def _first_blocks(pool):
    """The first block of each of the pool's segments and arenas."""
    strategy = pool._strategy
    for segment in getattr(strategy, "segments", {}).values():
        yield segment.first
    for arena in getattr(strategy, "arenas", {}).values():
        yield arena.first


def _block_holding(pool, address: int):
    """The block (live, cached or pending) holding `address`: a walk along its segment's or
    arena's block list (call with the pool's lock held). Free neighbours merge, so from the
    nearest live block below the address the walk is short."""
    starts = sorted(pool._allocated)
    i = bisect_right(starts, address) - 1
    if i >= 0:
        block = pool._allocated[starts[i]]
        while block is not None and block.end <= address:
            block = block.next
        if block is not None and block.start <= address:
            return block
    for block in _first_blocks(pool):        # no live block below it in the same list
        if block.start <= address:
            while block is not None and block.end <= address:
                block = block.next
            if block is not None and block.start <= address:
                return block
    return None


def _stream_ordered(block) -> bool:
    """Whether the running stream may still use a freed `block`: work queued on the block's own
    stream before the free runs after it, legitimately; a pending block (record_stream) waits
    for the streams that use it."""
    running = running_stream()
    if running is None:
        return False
    if block.allocated:                       # pending, or carved for the pool's plan
        return True
    owner = block.stream
    return owner is running or (owner is None and running.is_default)


def _record(start: int, requested: int, size: int, device: int, stream) -> Allocation:
    record = Allocation(start=start, size=requested, reserved=size, api="pool block",
                        device=device, buffer=None, free_api="caching_allocator_delete")
    record.extra["stream"] = stream
    return record


def stale_use(block: Allocation, what: str, address: int, nbytes: int) -> MemoryAccessError | None:
    """The error for queued work that uses `block` after it was freed, unless the work runs on
    the block's own stream (freeing there is ordered after that stream's queued work)."""
    if block.live:
        return None
    running = running_stream()
    owner = block.extra.get("stream")
    if running is not None and (owner is running or (owner is None and running.is_default)):
        return None
    where = f"on {running!r}" if running is not None else "on the host"
    return MemoryAccessError(
        f"{what}: 0x{address:x} (+{nbytes} bytes) is in {block.describe()}, freed while work "
        f"{where} still used it: call record_stream(pointer, stream) before freeing a block "
        "another stream uses (use after free; the block may hold another allocation's data)")


def warn(message: str) -> None:
    warnings.warn(message, SanitizerWarning, stacklevel=3)


SANITIZER = PoolSanitizer()


def enable(level: str | None = None) -> None:
    """Check accesses against pool blocks from now on, at `level` ("free" or "full"; None: the
    level NPUMEM_SANITIZE names, full where it names none). NPUMEM_SANITIZE does it at import."""
    from ..observe import OBSERVERS
    if level is None:
        level = environment_level()
        level = "full" if level == "off" else level
    if level not in ("free", "full"):
        raise InvalidParamError(f"sanitizer level {level!r}: use 'free' or 'full'")
    if level == "full":
        OBSERVERS.add(SANITIZER)
        SANITIZER.full = True
    else:
        _leave_full(OBSERVERS)
    SANITIZER.on = True


def disable() -> None:
    from ..observe import OBSERVERS
    SANITIZER.on = False
    _leave_full(OBSERVERS)


def _leave_full(observers) -> None:
    """Stop indexing: the index would miss what the pools do from now on, so it is dropped
    (a later full level seeds a new one from the pools' live blocks)."""
    SANITIZER.full = False
    observers.remove(SANITIZER)
    with SANITIZER._lock:
        SANITIZER._pools.clear()


if environment_level() != "off":
    enable(environment_level())
