"""Allocator statistics under PyTorch's names (`allocated_bytes.all.current`, ...).

Each stat keeps current, peak, allocated (sum of increases) and freed (sum of decreases), for
all memory and split by small pool (requests up to 1 MiB) and large pool.
"""

from __future__ import annotations

import threading

import numpy as np

POOLS = ("all", "small_pool", "large_pool")
# The first three change on every allocate and free: the allocator logs them (see PoolStats).
TRACKED = ("allocation", "allocated_bytes", "requested_bytes", "segment", "reserved_bytes",
           "pending", "pending_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
            "num_cache_misses", "num_sync_all_streams")     # num_cache_hits is derived
_INDEX = {name: 3 * i for i, name in enumerate(TRACKED)}
_LOGGED = 9                 # indices below this come from the event log
FOLD_AT = 3 * 2048          # log entries (three per event) that trigger a fold: at 2048 events
                            # the arrays stay in cache (74 ns per event folded, 120 at 8192)
_NUMPY_FROM = 3 * 64        # smaller logs fold in plain Python
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

    Values live in flat lists indexed 3 * stat + pool (pool 0 all, 1 small, 2 large): current,
    peak and grown (sum of increases); freed = grown - current.

    Allocations and frees are not counted one by one: the allocator appends
    (±size, ±requested, small) to `log`, and the log is folded into the counts — with numpy
    cumulative sums, so peaks stay exact — before any read and every FOLD_AT entries. Counting
    six values per event in Python cost more than the rest of a cache-hit allocate+free.

    `active` is derived exactly: a block is active from allocate until its memory can be reused,
    i.e. while allocated or pending (freed, waiting for other streams' events).
    """

    def __init__(self, lock=None):
        size = 3 * len(TRACKED)
        self.now, self.peaks, self.grown = [0] * size, [0] * size, [0] * size
        self.log: list[int] = []
        self.lock = lock or threading.RLock()      # the allocator's: the log changes under it
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.active_peak = [0, 0, 0]
        self.active_bytes_peak = [0, 0, 0]

    def fold(self) -> None:
        """Count the logged allocations and frees."""
        with self.lock:
            log = self.log
            if not log:
                return
            self.log = []
            if len(log) < _NUMPY_FROM:
                for i in range(0, len(log), 3):
                    size, requested, small = log[i], log[i + 1], log[i + 2]
                    count = 1 if size > 0 else -1
                    for k, amount in ((0, count), (3, size), (6, requested)):
                        self._count(k, small, amount)
                return
            events = np.fromiter(log, dtype=np.int64, count=len(log)).reshape(-1, 3).T
            sizes = events[0]
            # rows: allocation count, allocated_bytes, requested_bytes (stats 0, 3 and 6) of
            # every event, then the same masked to the small pool's events. A masked row stands
            # still at the large pool's events, so its running sums and peaks are the small
            # pool's own, and the large pool's running sums are the difference: one cumulative
            # sum and no compacted copies per pool.
            changes = np.empty((6, len(sizes)), dtype=np.int64)
            np.sign(sizes, out=changes[0])
            changes[1], changes[2] = sizes, events[1]
            np.multiply(changes[:3], events[2], out=changes[3:])
            running = np.cumsum(changes, axis=1)
            last, highest = running[:, -1].copy(), running.max(axis=1)   # (running changes below)
            grown = (np.abs(changes).sum(axis=1) + last) // 2      # the sums of the increases
            running[:3] -= running[3:]
            large = (last[:3] - last[3:], running[:3].max(axis=1), grown[:3] - grown[3:])
            for pool, (pool_last, pool_highest, pool_grown) in (
                    (0, (last[:3], highest[:3], grown[:3])),
                    (1, (last[3:], highest[3:], grown[3:])), (2, large)):
                for row in range(3):
                    index = 3 * row + pool
                    start = self.now[index]
                    self.now[index] = start + int(pool_last[row])
                    self.peaks[index] = max(self.peaks[index], start + int(pool_highest[row]))
                    self.grown[index] += int(pool_grown[row])

    def _count(self, k: int, small: bool, amount: int) -> None:
        now, peaks = self.now, self.peaks
        for index in (k, k + 1 if small else k + 2):
            now[index] += amount
            if amount > 0:
                self.grown[index] += amount
                if now[index] > peaks[index]:
                    peaks[index] = now[index]

    def add(self, name: str, small: bool, amount: int) -> None:
        """Change a stat the allocator does not log (segments, reserved, pending)."""
        self._count(_INDEX[name], small, amount)

    def _index(self, name: str, pool: str) -> int:
        index = _INDEX[name] + _POOL[pool]
        if index < _LOGGED and self.log:
            self.fold()
        return index

    def current(self, name: str, pool: str = "all") -> int:
        return self.now[self._index(name, pool)]

    def peak(self, name: str, pool: str = "all") -> int:
        return self.peaks[self._index(name, pool)]

    def stat(self, name: str, pool: str = "all") -> Stat:
        index = self._index(name, pool)
        now, grown = self.now[index], self.grown[index]
        return Stat(now, self.peaks[index], grown, grown - now)

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
        self.fold()
        self.peaks = list(self.now)
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
