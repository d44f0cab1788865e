"""Adaptors: resources that wrap an upstream resource and add one concern each.

    pool = CachingAllocator(backend)
    resource = LoggingAdaptor(StatisticsAdaptor(TrackingAdaptor(pool, stacks=True)), "alloc.csv")

They compose in any order, pass `allocate`/`deallocate` through, and are thread-safe.
"""

from __future__ import annotations

import csv
import datetime
import sys
import threading
from dataclasses import dataclass, field
from time import perf_counter_ns

from ..errors import MemoryFreeError
from ..units import format_size
from .built import native
from .resource import MemoryResource

StatisticsCounts = native("_statistics_adaptor").StatisticsCounts


class Adaptor(MemoryResource):
    """Pass-through base: override the hooks that matter."""

    def __init__(self, upstream: MemoryResource):
        self._upstream = upstream
        self.lock = threading.Lock()

    @property
    def upstream(self) -> MemoryResource:
        return self._upstream

    def allocate(self, nbytes: int, stream=None) -> int:
        return self._upstream.allocate(nbytes, stream)

    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        self._upstream.deallocate(pointer, nbytes, stream)

    def owns(self, pointer: int) -> bool:
        return self._upstream.owns(pointer)

    def _free_upstream(self, table: dict, pointer: int, nbytes, stream):
        """Free `pointer` upstream and return its entry in `table` (None if it has none).

        The entry leaves `table` before the upstream free and comes back if that fails: once the
        upstream has freed the pointer, another thread may be handed it and record its own entry.
        """
        entry = table.pop(pointer, None)
        try:
            self._upstream.deallocate(pointer, nbytes, stream)
        except Exception:
            if entry is not None:
                table[pointer] = entry
            raise
        return entry


class StatisticsAdaptor(StatisticsCounts, Adaptor):
    """Counts, bytes (current, peak, total) and latency of every call.

    `allocate`, `deallocate`, `stats()` and `reset_peak()` are StatisticsCounts', in C
    (_statistics_adaptor.c): in Python, timing and counting each call cost over half of a pool's
    cache-hit allocate+free. The counts change under the GIL with no Python code in between, so
    no lock is taken; peaks are exact (a free's bytes leave the count before the upstream frees
    them, so memory handed back to another thread is never counted twice). Only an Exception
    from the upstream is a counted failure, and it propagates with the counts intact. The
    counts are also attributes: allocations, frees, failures, current_bytes, peak_bytes,
    total_bytes, alloc_ns, free_ns, max_alloc_ns (read-only).
    """

    # Adaptor.__init__ stores the upstream in StatisticsCounts' `_upstream` slot.


@dataclass
class TrackedAllocation:
    pointer: int
    size: int
    stream: object
    time_ns: int
    thread: str
    tag: str = ""
    frames: list[tuple[str, int, str]] = field(default_factory=list)   # (file, line, function)


def capture_stack(skip: int, limit: int) -> list[tuple[str, int, str]]:
    """The caller's Python stack, innermost first, as (file, line, function)."""
    frame = sys._getframe(skip + 1)
    frames = []
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return frames


class TrackingAdaptor(Adaptor):
    """Remembers every live allocation: size, stream, time, thread, tag, optional Python stack."""

    def __init__(self, upstream: MemoryResource, stacks: bool = False, max_frames: int = 16):
        super().__init__(upstream)
        self.stacks, self.max_frames = stacks, max_frames
        self.tag = ""
        self._live: dict[int, TrackedAllocation] = {}

    def allocate(self, nbytes: int, stream=None) -> int:
        pointer = self._upstream.allocate(nbytes, stream)
        frames = capture_stack(1, self.max_frames) if self.stacks else []
        record = TrackedAllocation(pointer, nbytes, stream, perf_counter_ns(),
                                   threading.current_thread().name, self.tag, frames)
        with self.lock:
            self._live[pointer] = record
        return pointer

    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        self._free_upstream(self._live, pointer, nbytes, stream)

    def live(self) -> list[TrackedAllocation]:
        with self.lock:
            return sorted(self._live.values(), key=lambda r: r.time_ns)

    def report(self, limit: int = 20) -> str:
        live = self.live()
        total = sum(r.size for r in live)
        lines = [f"{len(live)} live allocation(s), {format_size(total)}"]
        for record in live[:limit]:
            where = f" at {record.frames[0][0]}:{record.frames[0][1]} in {record.frames[0][2]}" \
                if record.frames else ""
            tag = f" [{record.tag}]" if record.tag else ""
            lines.append(f"  0x{record.pointer:x} {format_size(record.size)}{tag}{where}")
        return "\n".join(lines)


class LoggingAdaptor(Adaptor):
    """Writes every call as RMM's CSV log: Thread,Time,Action,Pointer,Size,Stream.

    Actions are `allocate`, `free` and `allocate failure`, so RMM's replay tools read it.
    """

    HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")

    def __init__(self, upstream: MemoryResource, path_or_file, flush_every: int = 1):
        super().__init__(upstream)
        self._own = isinstance(path_or_file, (str, bytes)) or hasattr(path_or_file, "__fspath__")
        self._file = open(path_or_file, "w", newline="", encoding="utf-8") if self._own else path_or_file
        self._writer = csv.writer(self._file)
        self._writer.writerow(self.HEADER)
        self._sizes: dict[int, int] = {}
        self._flush_every, self._pending = flush_every, 0

    def _log(self, action: str, pointer: int, size: int, stream) -> None:
        now = datetime.datetime.now().strftime("%H:%M:%S.%f")
        handle = getattr(stream, "handle", stream) or 0
        with self.lock:
            self._writer.writerow((threading.get_ident(), now, action, f"0x{pointer:x}", size, handle))
            self._pending += 1
            if self._pending >= self._flush_every:
                self._file.flush()
                self._pending = 0

    def allocate(self, nbytes: int, stream=None) -> int:
        try:
            pointer = self._upstream.allocate(nbytes, stream)
        except Exception:
            self._log("allocate failure", 0, nbytes, stream)
            raise
        self._sizes[pointer] = nbytes
        self._log("allocate", pointer, nbytes, stream)
        return pointer

    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        size = self._free_upstream(self._sizes, pointer, nbytes, stream)
        self._log("free", pointer, (nbytes or 0) if size is None else size, stream)

    def close(self) -> None:
        with self.lock:
            self._file.flush()
            if self._own:
                self._file.close()


class LimitingAdaptor(Adaptor):
    """Refuses requests that would put more than `limit` bytes outstanding."""

    def __init__(self, upstream: MemoryResource, limit: int):
        super().__init__(upstream)
        self.limit = limit
        self.outstanding = 0
        self._sizes: dict[int, int] = {}

    def allocate(self, nbytes: int, stream=None) -> int:
        from .caching_allocator import OutOfMemoryError
        with self.lock:
            if self.outstanding + nbytes > self.limit:
                raise OutOfMemoryError(
                    f"allocation of {format_size(nbytes)} refused: {format_size(self.outstanding)} "
                    f"of the {format_size(self.limit)} limit is outstanding "
                    f"({format_size(self.limit - self.outstanding)} left)")
            self.outstanding += nbytes          # reserve before calling up, release on failure
        try:
            pointer = self._upstream.allocate(nbytes, stream)
        except Exception:
            with self.lock:
                self.outstanding -= nbytes
            raise
        with self.lock:
            self._sizes[pointer] = nbytes
        return pointer

    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        size = self._free_upstream(self._sizes, pointer, nbytes, stream) \
            if pointer in self._sizes else None
        if size is None:
            raise MemoryFreeError(f"deallocate(0x{pointer:x}): not allocated through this limit")
        with self.lock:
            self.outstanding -= size
