"""Allocator statistics under PyTorch's names (`allocated_bytes.all.current`, ...).

Each stat keeps current, peak, allocated (sum of increases) and freed (sum of decreases), for
all memory and split by small pool (requests up to 1 MiB) and large pool.
"""

from __future__ import annotations

POOLS = ("all", "small_pool", "large_pool")
TRACKED = ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes", "active_bytes",
           "requested_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
            "num_cache_hits", "num_cache_misses", "num_sync_all_streams")


class Stat:
    """One statistic: current value, peak, total increases, total decreases."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, amount: int) -> None:
        self.current += amount
        if amount >= 0:
            self.allocated += amount
            if self.current > self.peak:
                self.peak = self.current
        else:
            self.freed -= amount

    def reset_peak(self) -> None:
        self.peak = self.current

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated,
                "freed": self.freed}


class PoolStats:
    """The tracked stats for every pool, plus event counters."""

    def __init__(self):
        self.stats = {name: {pool: Stat() for pool in POOLS} for name in TRACKED}
        self.counters = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, small: bool, amount: int) -> None:
        by_pool = self.stats[name]
        by_pool["all"].add(amount)
        by_pool["small_pool" if small else "large_pool"].add(amount)

    def current(self, name: str, pool: str = "all") -> int:
        return self.stats[name][pool].current

    def peak(self, name: str, pool: str = "all") -> int:
        return self.stats[name][pool].peak

    def reset_peaks(self) -> None:
        for by_pool in self.stats.values():
            for stat in by_pool.values():
                stat.reset_peak()

    def flat(self, derived: dict[str, dict[str, Stat]]) -> dict[str, int]:
        """`name.pool.metric` keys, PyTorch style, for tracked and `derived` stats."""
        out: dict[str, int] = {}
        for source in (self.stats, derived):
            for name, by_pool in source.items():
                for pool, stat in by_pool.items():
                    for metric, value in stat.as_dict().items():
                        out[f"{name}.{pool}.{metric}"] = value
        out.update(self.counters)
        return dict(sorted(out.items()))
