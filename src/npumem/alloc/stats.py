"""Allocator statistics under PyTorch's names (`allocated_bytes.all.current`, ...).

Each stat keeps current, peak, allocated (sum of increases) and freed (sum of decreases), for
all memory and split by small pool (requests up to 1 MiB) and large pool.
"""

from __future__ import annotations

POOLS = ("all", "small_pool", "large_pool")
# The first three change on every allocate and free (PoolStats.block_allocated / block_freed).
TRACKED = ("allocation", "allocated_bytes", "requested_bytes", "segment", "reserved_bytes",
           "pending", "pending_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
            "num_cache_hits", "num_cache_misses", "num_sync_all_streams")
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

    Values live in flat lists indexed 3 * stat + pool (pool 0 all, 1 small, 2 large): current,
    peak and grown (sum of increases); freed = grown - current. Flat lists, because the
    allocator updates six of them on every allocate and free.

    `active` is derived exactly: a block is active from allocate until its memory can be reused,
    i.e. while allocated or pending (freed, waiting for other streams' events).
    """

    def __init__(self):
        size = 3 * len(TRACKED)
        self.now, self.peaks, self.grown = [0] * size, [0] * size, [0] * size
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.active_peak = [0, 0, 0]
        self.active_bytes_peak = [0, 0, 0]

    def block_allocated(self, small: bool, size: int, requested: int) -> None:
        now, peaks, grown = self.now, self.peaks, self.grown
        for k, amount in ((0, 1), (3, size), (6, requested)):
            for index in (k, k + 1 if small else k + 2):
                value = now[index] + amount
                now[index] = value
                grown[index] += amount
                if value > peaks[index]:
                    peaks[index] = value

    def block_freed(self, small: bool, size: int, requested: int) -> None:
        now, pool = self.now, 1 if small else 2
        now[0] -= 1
        now[pool] -= 1
        now[3] -= size
        now[3 + pool] -= size
        now[6] -= requested
        now[6 + pool] -= requested

    def add(self, name: str, small: bool, amount: int) -> None:
        k = _INDEX[name]
        now, peaks = self.now, self.peaks
        for index in (k, k + 1 if small else k + 2):
            now[index] += amount
            if amount > 0:
                self.grown[index] += amount
                peaks[index] = max(peaks[index], now[index])

    def current(self, name: str, pool: str = "all") -> int:
        return self.now[_INDEX[name] + _POOL[pool]]

    def peak(self, name: str, pool: str = "all") -> int:
        return self.peaks[_INDEX[name] + _POOL[pool]]

    def stat(self, name: str, pool: str = "all") -> Stat:
        index = _INDEX[name] + _POOL[pool]
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

    def reset_peaks(self) -> None:
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
        out.update(self.counters)
        return dict(sorted(out.items()))
