"""The sanitizer inside the caching pools: every pool block's requested extent and lifetime.

The device sanitizer (address_index) knows what the runtime's malloc handed out; a pool carves
its segments and arenas further, so a 1-byte overrun of a 100-byte block, a read after
`caching_allocator_delete` or a workspace too small for its kernel all land in memory the
device thinks is live. With the pool sanitizer on, accesses inside a pool's memory must also
lie inside one live block's requested bytes, and:

- queued work that resolved a block and runs after the block was freed (on another stream than
  the block's own, without `record_stream`) fails on its stream: the block may hold someone
  else's data by then;
- a tensor whose storage was freed (`Storage.free()`) and whose bytes now belong to another
  allocation is reported as stale, not read;
- `caching_allocator_delete` of a tensor's storage is refused (the tensor would free it again).

It costs a record per allocation and a lookup per access, so it is a mode: NPUMEM_SANITIZE=1
(the test suite runs with it), or `enable()`. docs/reliability.md has the cost.
"""

from __future__ import annotations

import collections
import os
import threading
import warnings
import weakref

from ..errors import MemoryAccessError
from .address_index import AddressIndex, Allocation


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


class PoolSanitizer:
    """An observer of the caching pools (see npumem.observe) that indexes their blocks."""

    def __init__(self):
        self.on = False
        self._lock = threading.Lock()
        self._pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pool -> records

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
        """The live record of the block at `pointer` (None when the sanitizer is off)."""
        return self._records(pool).live.get(pointer) if self.on else None

    def check(self, rng, what: str):
        """`rng` (inside a pool's segment or arena) with the block it lies in, or
        MemoryAccessError: past the block's requested bytes, in a freed block, between blocks."""
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
    from ..runtime.stream import running_stream   # runtime imports device: import late

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


def enable() -> None:
    """Check accesses against pool blocks from now on (NPUMEM_SANITIZE=1 does it at import)."""
    from ..observe import OBSERVERS
    OBSERVERS.add(SANITIZER)
    SANITIZER.on = True


def disable() -> None:
    from ..observe import OBSERVERS
    SANITIZER.on = False
    OBSERVERS.remove(SANITIZER)


if os.environ.get("NPUMEM_SANITIZE", "") not in ("", "0"):
    enable()
