"""The caching pools this process holds, one per device, as `npumem.memory` made them: a registry
below both the API that makes them (memory.py) and the profiler that samples them."""

from __future__ import annotations

import threading


class PoolRegistry:
    def __init__(self):
        self.lock = threading.RLock()
        self.by_device: dict = {}           # device -> CachingAllocator

    def in_device_order(self) -> list:
        """(device, pool) pairs, a copy taken under the lock."""
        with self.lock:
            return sorted(self.by_device.items())


POOLS = PoolRegistry()
