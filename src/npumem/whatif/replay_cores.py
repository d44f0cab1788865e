"""What plays a recording's allocs and frees through the model of PyTorch's allocator: the
native model (alloc/torch_model/_native.c) where it covers the recording, the Python model
otherwise (numbers past 2**62, a checkout whose extension is not built).

Both are "cores" with one face, which torch_replay drives:
- `run(kinds, action, addr, size, stream, start, stop, stop_on_events)` plays the plain entries
  (allocs, frees; `kinds[action]` says which an entry is) and stops at an irregular one
  (segment events, a recorded OOM), at an alloc the model cannot serve, or with
  `stop_on_events` after an alloc that made segment events: `(index, why)`;
- `oom_request(index, size, stream)` replays a request the real allocator refused;
- `model` answers what the rare calls need (empty_cache, would_reuse, oversize_release,
  collected, release_fully, routed: a request's pool and capture, named by MempoolId_t);
- `new_events()`, `oom_error()` and `counts()` say what happened.

PythonCore.run is the oracle of the native one (tests/test_native_model.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..alloc.torch_model import DEFAULT_POOL, ModelOutOfMemory, TorchAllocatorModel
from ..alloc.torch_model.allocator import (SegmentEvent, address_space, expandable_groups,
                                           expandable_page,
                                           out_of_memory_error, restored_range)
from ..alloc.torch_model.config import NO_LIMIT
from ..trace.snapshot.columns import ACTION_CODE, SEGMENT_ADD, SEGMENT_REMOVE

try:
    from ..alloc.torch_model import _native
except ImportError:                 # a checkout not installed with `pip install -e .`
    _native = None

SKIP, ALLOC, FREE, IRREGULAR = 0, 1, 2, 3
DONE, AT_IRREGULAR, EVENTS, OUT_OF_MEMORY = 0, 1, 2, 3
_IRREGULAR = (*SEGMENT_ADD, *SEGMENT_REMOVE, "oom")
NATIVE_LIMIT = 1 << 62              # sizes, addresses and limits the native model takes


def kinds(free_action: str) -> np.ndarray:
    """What `run` does with each action code."""
    table = np.zeros(256, np.uint8)
    table[ACTION_CODE["alloc"]] = ALLOC
    table[ACTION_CODE[free_action]] = FREE
    for action in _IRREGULAR:
        table[ACTION_CODE[action]] = IRREGULAR
    return table


@dataclass
class Counts:
    allocated: int            # requested bytes live now, start state included
    peak_allocated: int
    unmatched: int            # frees of no live block, allocs over a live one
    misplaced: int            # allocs the model put at another address
    requests: int
    peak_reserved: int
    device_allocs: int
    device_frees: int
    cache_hits: int


class PythonCore:
    """The Python model: every recording, private pools and captures too. `pools` and
    `captured` (the start state's) say where each request went."""

    def __init__(self, model: TorchAllocatorModel, live: dict, allocated: int,
                 pools: dict[int, tuple], captured: set[int]):
        self.model, self.live, self.pools, self.captured = model, live, pools, captured
        self.allocated = self.peak_allocated = allocated
        self.unmatched = self.misplaced = self.requests = 0
        self._seen = 0
        self._oom: ModelOutOfMemory | None = None

    def run(self, kinds, action, addr, size, stream, start: int, stop: int,
            stop_on_events: bool) -> tuple[int, int]:
        events = self.model.stats.events
        for index in range(start, stop):
            kind = kinds[action[index]]
            if kind == ALLOC:
                before = len(events)
                if not self._alloc(index, int(addr[index]), int(size[index]), int(stream[index])):
                    return index, OUT_OF_MEMORY
                if stop_on_events and len(events) > before:
                    return index + 1, EVENTS
            elif kind == FREE:
                self._free(int(addr[index]))
            elif kind == IRREGULAR:
                return index, AT_IRREGULAR
        return stop, DONE

    def _malloc(self, index: int, size: int, stream: int):
        """The request, made where the real allocator made it: in its pool, during a capture
        or not (the common case, the default pool outside any, goes straight to malloc)."""
        pool, capturing = self.pools.get(index, DEFAULT_POOL), index in self.captured
        model = self.model
        if pool == DEFAULT_POOL and not capturing:
            return model.malloc(size, stream)
        with model.routed(pool, capturing):
            return model.malloc(size, stream)

    def _alloc(self, index: int, addr: int, size: int, stream: int) -> bool:
        self.requests += 1
        try:
            block = self._malloc(index, size, stream)
        except ModelOutOfMemory as exc:
            self._oom = exc
            return False
        if block.addr != addr:
            self.misplaced += 1
        if addr in self.live:             # its free was never recorded
            self.unmatched += 1
        self.live[addr] = block
        self._count(size)
        return True

    def _count(self, size: int) -> None:
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def _free(self, addr: int) -> None:
        block = self.live.pop(addr, None)
        if block is None or not block.allocated:
            self.unmatched += 1
        else:
            self.allocated -= block.requested
            self.model.free(block)

    def oom_request(self, index: int, size: int, stream: int) -> bool:
        """Whether a request the real allocator refused fits here (its bytes then count as
        live; no block is kept for it)."""
        try:
            self._malloc(index, size, stream)
        except ModelOutOfMemory as exc:
            self._oom = exc
            return False
        self._count(size)
        return True

    def oom_error(self) -> ModelOutOfMemory:
        return self._oom

    def new_events(self) -> list[SegmentEvent]:
        events = self.model.stats.events
        new, self._seen = events[self._seen:], len(events)
        return new

    @property
    def allowed(self) -> int | None:
        return self.model.allowed

    def counts(self) -> Counts:
        stats = self.model.stats
        return Counts(self.allocated, self.peak_allocated, self.unmatched, self.misplaced,
                      self.requests, stats.peak_reserved, stats.num_device_alloc,
                      stats.num_device_free, stats.cache_hits)


if _native is not None:
    class NativeModel(_native.Model):
        """The native model with its pools named as the Python model names them (MempoolId_t
        tuples); the C model knows them by slot."""

        def __init__(self, *args):
            super().__init__(*args)
            self.slots, self.ids = {DEFAULT_POOL: 0}, [DEFAULT_POOL]

        def slot(self, pool_id: tuple) -> int:
            slot = self.slots.get(pool_id)
            if slot is None:
                slot = self.slots[pool_id] = self.add_pool()
                self.ids.append(pool_id)
            return slot

        def empty_cache(self, pool_id: tuple = DEFAULT_POOL) -> None:
            super().empty_cache(self.slot(pool_id))

        def release_fully(self, pool_id: tuple) -> None:
            super().release_fully(self.slot(pool_id))

        @contextmanager
        def routed(self, pool_id: tuple, capturing: bool = False):
            """As TorchAllocatorModel.routed (not nested, but in one to the default pools
            with no capture, which changes nothing)."""
            if pool_id == DEFAULT_POOL and not capturing:
                yield
                return
            self.route(self.slot(pool_id), capturing)
            try:
                yield
            finally:
                self.route(0, False)


class NativeCore:
    """The native model (_native.c): default and private pools, of cudaMalloc'd or expandable
    segments, with garbage collection. `pools` and `captured` (the start state's) say where
    each of the `entries` requests went."""

    def __init__(self, config, capacity: int | None, allowed: int | None, fresh_base: int,
                 expected: list[tuple[int, int]], segments, allocated: int,
                 pools: dict[int, tuple] | None = None, captured=(), entries: int = 0):
        self.allowed, self.config = allowed, config
        self.model = NativeModel(
            config.pad, list(config.roundup_power2_divisions), config.max_split_size,
            config.max_non_split_rounding_size, config.large_segment_size, config.page_size_1g,
            config.expandable_segments, config.expandable_large_page, config.flavour == "npu",
            config.base_addr_aligned_kb * 1024, config.garbage_collection_threshold,
            -1 if capacity is None else capacity,
            -1 if allowed is None else allowed, address_space(capacity), fresh_base,
            [number for pair in expected for number in pair])
        self.pools, self.captured = pools or {}, set(captured)
        self._restore(segments, capacity)
        self.model.start(allocated)
        self.routes = self._routes(entries) if self.pools or self.captured else None
        self._seen = 0

    def _routes(self, entries: int) -> np.ndarray:
        """Each request's pool slot times 2, plus 1 during a capture (run's routes)."""
        routes = np.zeros(entries, np.int32)
        for index, pool in self.pools.items():
            if 0 <= index < entries:
                routes[index] = 2 * self.model.slot(pool)
        for index in self.captured:
            if 0 <= index < entries:
                routes[index] |= 1
        return routes

    def run(self, kinds, action, addr, size, stream, start: int, stop: int,
            stop_on_events: bool) -> tuple[int, int]:
        return self.model.run(kinds, action, addr, size, stream, start, stop, stop_on_events,
                              self.routes)

    def _restore(self, segments, capacity: int | None) -> None:
        """As TorchAllocatorModel.restore: the cudaMalloc'd segments, then each stream's
        expandable ranges of a pool as one segment from the lowest address the trace maps."""
        def blocks(segment):
            return [(b.addr, b.size, b.requested, b.allocated) for b in segment.blocks]

        slot = self.model.slot
        self.model.restore([(s.addr, s.size, s.stream, s.small, slot(s.pool), blocks(s))
                            for s in segments if not s.expandable])
        for (stream, pool, small), ranges in expandable_groups(segments).items():
            base, space = restored_range(ranges, capacity, segments,
                                         expandable_page(self.config, small))
            self.model.restore_expandable(stream, small, slot(pool), base, space,
                                          [(r.addr, r.size, blocks(r)) for r in ranges])

    def oom_request(self, index: int, size: int, stream: int) -> bool:
        with self.model.routed(self.pools.get(index, DEFAULT_POOL), index in self.captured):
            return self.model.oom_request(size, stream)

    def oom_error(self) -> ModelOutOfMemory:
        orig, size, alloc_size, stream, free, usable, largest = self.model.last_oom()
        stats = self.model.stats()
        return out_of_memory_error(orig, alloc_size, free, self.allowed is not None,
                                   stats["allocated"], stats["reserved"], usable, largest)

    def new_events(self) -> list[SegmentEvent]:
        new = self.model.events(self._seen)
        self._seen += len(new)
        ids = self.model.ids
        return [SegmentEvent(action, addr, size, stream, ids[slot])
                for action, addr, size, stream, slot in new]

    def counts(self) -> Counts:
        s = self.model.stats()
        return Counts(s["replay_allocated"], s["replay_peak"], s["unmatched"], s["misplaced"],
                      s["requests"], s["peak_reserved"], s["num_device_alloc"],
                      s["num_device_free"], s["cache_hits"])


def native_covers(config, allowed: int | None, a, fresh_base: int, capacity: int | None) -> str:
    """Why the native model cannot replay this ("" when it can); `a`: the trace as
    columns.Arrays."""
    if _native is None:
        return "the native model is not built"
    if a.addr.dtype != np.uint64 or a.size.dtype != np.uint64 or a.stream.dtype != np.uint64:
        return "numbers outside 64 bits"
    # (addresses: the fresh base lies above every recorded one)
    highest = max(fresh_base, address_space(capacity), allowed or 0, config.large_segment_size,
                  config.expandable_large_page, int(a.size.max()) if len(a.size) else 0,
                  0 if config.max_split_size == NO_LIMIT else config.max_split_size)
    if highest >= NATIVE_LIMIT:
        return "numbers past 2**62"
    return ""
