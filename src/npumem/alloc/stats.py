"""Allocator statistics under PyTorch's names (`allocated_bytes.all.current`, ...).

Each stat keeps current, peak, allocated (sum of increases) and freed (sum of decreases), for
all memory and split by small pool (requests up to 1 MiB) and large pool.
"""

from __future__ import annotations

import threading

from .built import native

Counts = native("_pool_stats").Counts

POOLS = ("all", "small_pool", "large_pool")
# The first three change on every allocate and free (PoolStats.alloc / PoolStats.free).
TRACKED = ("allocation", "allocated_bytes", "requested_bytes", "segment", "reserved_bytes",
           "pending", "pending_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
            "num_cache_misses", "num_sync_all_streams")     # num_cache_hits is derived
_INDEX = {name: 3 * i for i, name in enumerate(TRACKED)}
_POOL = {pool: j for j, pool in enumerate(POOLS)}


class Stat:
    """One statistic, as reported: current value, peak, total increases, total decreases."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self, current: int = 0, peak: int = 0, allocated: int = 0, freed: int = 0):
        self.current, self.peak, self.allocated, self.freed = current, peak, allocated, freed

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated,
                "freed": self.freed}


class PoolStats:
    """The tracked stats for every pool, plus event counters.

    The counts live in C (`_pool_stats.Counts`), in slots 3 * stat + pool (pool 0 all, 1 small,
    2 large): current, peak and grown (sum of increases); freed = grown - current. An allocate
    or a free is one call, `alloc(size, requested, small)` or `free(...)`, which the allocator
    binds once: counting in Python, or logging the events and folding the log with numpy, cost
    more than the rest of a cache-hit allocate+free. Peaks are exact at every moment.

    `active` is derived exactly: a block is active from allocate until its memory can be reused,
    i.e. while allocated or pending (freed, waiting for other streams' events).
    """

    def __init__(self, lock=None):
        self.counts = Counts(3 * len(TRACKED))
        self.alloc, self.free = self.counts.alloc, self.counts.free
        self.lock = lock or threading.RLock()      # the allocator's: the counts change under it
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.active_peak = [0, 0, 0]
        self.active_bytes_peak = [0, 0, 0]

    def add(self, name: str, small: bool, amount: int) -> None:
        """Change a stat other than the three alloc and free change (segments, reserved,
        pending)."""
        self.counts.add(_INDEX[name], small, amount)

    def current(self, name: str, pool: str = "all") -> int:
        return self.counts.get(_INDEX[name] + _POOL[pool])[0]

    def peak(self, name: str, pool: str = "all") -> int:
        return self.counts.get(_INDEX[name] + _POOL[pool])[1]

    def stat(self, name: str, pool: str = "all") -> Stat:
        now, peak, grown = self.counts.get(_INDEX[name] + _POOL[pool])
        return Stat(now, peak, grown, grown - now)

    def note_active_peak(self) -> None:
        """Called after an allocation while blocks are pending: active may peak above allocated."""
        for j in range(3):
            self.active_peak[j] = max(self.active_peak[j], self.current("allocation", POOLS[j]) +
                                      self.current("pending", POOLS[j]))
            self.active_bytes_peak[j] = max(self.active_bytes_peak[j],
                                            self.current("allocated_bytes", POOLS[j]) +
                                            self.current("pending_bytes", POOLS[j]))

    def active(self) -> dict[str, dict[str, Stat]]:
        """The derived active / active_bytes stats."""
        out = {}
        for name, base, pending, peaks in (("active", "allocation", "pending", self.active_peak),
                                           ("active_bytes", "allocated_bytes", "pending_bytes",
                                            self.active_bytes_peak)):
            out[name] = {}
            for j, pool in enumerate(POOLS):
                allocated, waiting = self.stat(base, pool), self.current(pending, pool)
                out[name][pool] = Stat(allocated.current + waiting, max(peaks[j], allocated.peak),
                                       allocated.allocated, allocated.freed - waiting)
        return out

    def counter_values(self) -> dict[str, int]:
        """The event counters, with num_cache_hits = allocations - cache misses."""
        hits = self.stat("allocation").allocated - self.counters["num_cache_misses"]
        return {**self.counters, "num_cache_hits": hits}

    def hit_rate(self) -> float:
        """Share of allocations served from the cache (1.0 before any)."""
        allocations = self.stat("allocation").allocated
        return 1 - self.counters["num_cache_misses"] / allocations if allocations else 1.0

    def reset_peaks(self) -> None:
        self.counts.reset_peaks()
        self.active_peak = [0, 0, 0]
        self.active_bytes_peak = [0, 0, 0]
        self.note_active_peak()

    def flat(self, derived: dict[str, dict[str, Stat]]) -> dict[str, int]:
        """`name.pool.metric` keys, PyTorch style, for tracked and `derived` stats."""
        tracked = {name: {pool: self.stat(name, pool) for pool in POOLS}
                   for name in TRACKED if not name.startswith("pending")}
        out: dict[str, int] = {}
        for source in (tracked, self.active(), derived):
            for name, by_pool in source.items():
                for pool, stat in by_pool.items():
                    for metric, value in stat.as_dict().items():
                        out[f"{name}.{pool}.{metric}"] = value
        out.update(self.counter_values())
        return dict(sorted(out.items()))
