"""A caching pool of pinned host memory, for staging buffers of asynchronous copies.

malloc_host is slow and pins pages; staging buffers come and go every step. The pool keeps freed
buffers and hands the smallest cached one that fits (at most twice the request, so a small
request never pins a huge buffer). A buffer freed with a stream is reused only once the work
queued on that stream before the free has finished, since an async copy may still read it.
"""

from __future__ import annotations

import bisect
import threading

from ..errors import MemoryFreeError
from ..runtime import memory as rt_memory
from ..runtime.stream import Event
from ..units import align_up


class HostPool:
    """Cached pinned host buffers (sizes rounded to 512 bytes)."""

    def __init__(self, allocate=rt_memory.malloc_host, release=rt_memory.free_host):
        self._allocate, self._release = allocate, release
        self.lock = threading.Lock()
        self._free: list[tuple[int, int]] = []           # (size, pointer), sorted
        self._in_use: dict[int, int] = {}                # pointer -> size
        self._pending: list[tuple[int, int, Event]] = []  # freed on a stream, not yet safe
        self.hits = self.misses = 0

    def allocate(self, nbytes: int) -> int:
        size = align_up(max(nbytes, 1), 512)
        with self.lock:
            self._collect_pending()
            i = bisect.bisect_left(self._free, (size, 0))
            if i < len(self._free) and self._free[i][0] <= 2 * size:
                size, pointer = self._free.pop(i)
                self.hits += 1
            else:
                pointer = None
        if pointer is None:
            pointer = self._allocate(size)
            with self.lock:
                self.misses += 1
        with self.lock:
            self._in_use[pointer] = size
        return pointer

    def free(self, pointer: int, stream=None) -> None:
        """Return a buffer; with `stream`, only reuse it after that stream's queued work."""
        with self.lock:
            size = self._in_use.pop(pointer, None)
            if size is None:
                raise MemoryFreeError(f"host pool free(0x{pointer:x}): not a buffer in use from this pool")
            if stream is None:
                bisect.insort(self._free, (size, pointer))
                return
        event = Event()
        event.record(stream)
        with self.lock:
            self._pending.append((size, pointer, event))

    def _collect_pending(self) -> None:
        still = []
        for size, pointer, event in self._pending:
            if event.query():
                bisect.insort(self._free, (size, pointer))
            else:
                still.append((size, pointer, event))
        self._pending = still

    def empty_cache(self) -> int:
        """Free cached buffers (waiting for pending ones); returns bytes released."""
        with self.lock:
            pending, self._pending = self._pending, []
        for size, pointer, event in pending:
            event.synchronize()
            with self.lock:
                bisect.insort(self._free, (size, pointer))
        with self.lock:
            cached, self._free = self._free, []
        for _, pointer in cached:
            self._release(pointer)
        return sum(size for size, _ in cached)

    def stats(self) -> dict:
        with self.lock:
            return {"in_use_bytes": sum(self._in_use.values()), "in_use": len(self._in_use),
                    "cached_bytes": sum(s for s, _ in self._free) + sum(s for s, _, _ in self._pending),
                    "hits": self.hits, "misses": self.misses}

    def close(self) -> None:
        """At finalize, once the devices' work is done: free the cached buffers (npumem's own,
        not a leak), and forget the ones in use (finalize reports those)."""
        with self.lock:
            cached = [pointer for _, pointer in self._free] + [p for _, p, _ in self._pending]
            self._free, self._in_use, self._pending = [], {}, []
        for pointer in cached:
            self._release(pointer)
