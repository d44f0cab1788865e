"""A background thread that samples memory use at a fixed interval.

    with Sampler(interval_ms=10) as sampler:
        train()
    peak = max(s.reserved for s in sampler.samples())

Each tick records, per device with a caching pool: the pool's allocated and reserved bytes, its
cache hit rate and fragmentation, and the device's used and total bytes; and the process's host
resident set size. The samples live in a ring buffer (`max_samples`), so memory stays bounded
however long the run.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import NamedTuple

from ..alloc.process_pools import POOLS
from ..constants import MemAttr
from ..errors import InvalidParamError
from ..runtime.state import RUNTIME

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Sample(NamedTuple):
    time_ns: int                   # time.perf_counter_ns()
    device: int                    # -1 when no device is in use (host RSS only)
    allocated: int
    reserved: int
    device_used: int
    device_total: int
    cache_hit_rate: float
    fragmentation: float
    host_rss: int


def host_rss() -> int:
    """Resident set size of this process in bytes (peak RSS where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def take_samples() -> list[Sample]:
    """One sample per device with a pool (or one host-only sample)."""
    now, rss = time.perf_counter_ns(), host_rss()
    samples = []
    backend = RUNTIME.backend
    for device, pool in POOLS.in_device_order():
        with pool.lock:
            stats = pool.stats
            allocated, reserved = stats.current("allocated_bytes"), stats.current("reserved_bytes")
            hit_rate = stats.hit_rate()
        fragmentation = pool.fragmentation_ratio()      # O(free lists), not O(blocks)
        free, total = backend.mem_info(device, MemAttr.HBM_MEM) if backend else (0, 0)
        samples.append(Sample(now, device, allocated, reserved, total - free, total,
                              hit_rate, fragmentation, rss))
    return samples or [Sample(now, -1, 0, 0, 0, 0, 1.0, 0.0, rss)]


SHARE = 50             # sampling gets at most 1/50 (2%) of the time


class Sampler:
    """Samples every `interval_ms` on a daemon thread until stopped."""

    def __init__(self, interval_ms: float = 10.0, max_samples: int = 100_000):
        if interval_ms <= 0:
            raise InvalidParamError(f"interval_ms must be positive, got {interval_ms}")
        if max_samples <= 0:
            raise InvalidParamError(f"max_samples must be positive, got {max_samples}")
        self.interval = interval_ms / 1e3
        self._samples: deque[Sample] = deque(maxlen=max_samples)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0                     # ticks that failed (e.g. a device being reset)

    def start(self) -> "Sampler":
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="npumem-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> "Sampler":
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.tick()                      # the state at the end
        return self

    def tick(self) -> None:
        try:
            self._samples.extend(take_samples())
        except Exception:                    # noqa: BLE001 - sampling must never break the run
            self.errors += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.tick()
            spent = time.perf_counter() - started
            # A sample over a million live blocks takes a while (and holds each pool's lock):
            # wait long enough that sampling never takes more than 1/SHARE of the run.
            self._stop.wait(max(self.interval, spent * SHARE))

    def samples(self) -> list[Sample]:
        return list(self._samples)

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
