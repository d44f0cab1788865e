"""Which address ranges are live, and what to say when an access misses them.

Both the simulated device and the pinned host memory registry keep one `AddressIndex`. It answers
"which allocation holds this range?" in O(log n) and, when the answer is "none", builds the
sanitizer-style message: the address, the nearest allocation and how far off the access is, or
the freed allocation it falls in (use after free).
"""

from __future__ import annotations

import bisect
import collections
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import MemoryAccessError, MemoryFreeError
from ..units import format_size

_sequence = itertools.count(1)


@dataclass(eq=False)
class Allocation:
    """One allocation: `size` usable bytes at `start`, `reserved` bytes taken from the device."""

    start: int
    size: int
    reserved: int
    api: str                      # the call that made it: "malloc", "malloc_host", "dvpp_malloc", ...
    device: int                   # device index, or -1 for host memory
    buffer: np.ndarray | None = field(repr=False)  # the real bytes (None once freed)
    host_address: int = 0         # where buffer's first byte lives in this process
    page_kind: str = ""           # "huge" | "normal" | "" (host)
    free_api: str = "free"        # the call that must release it
    live: bool = True
    pool: Any = field(default=None, repr=False)   # the caching pool carving it into blocks
    seq: int = field(default_factory=lambda: next(_sequence))
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.size

    def describe(self) -> str:
        state = "" if self.live else ", freed"
        return f"{self.api} allocation 0x{self.start:x} of {self.size} bytes (#{self.seq}{state})"


class ReleaseEpoch:
    """Counts every release of device bytes (a free, an unmap), in any backend. A range
    checked while the count was N is still good while it is N: that lets small ops skip
    checking the same ranges again and again."""

    value = 0

    @classmethod
    def bump(cls) -> None:
        cls.value += 1


RELEASES = ReleaseEpoch


class AddressIndex:
    """Live allocations sorted by start address, plus the most recently freed ones."""

    def __init__(self, remembered_frees: int = 4096, track_usage: bool = False):
        self._starts: list[int] = []
        self._by_start: dict[int, Allocation] = {}
        self._freed: collections.OrderedDict[int, Allocation] = collections.OrderedDict()
        self._remembered_frees = remembered_frees
        # api -> [current, peak] reserved bytes, for a device's index (get_mem_usage_info)
        self.usage: dict[str, list[int]] | None = {} if track_usage else None

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, allocation: Allocation) -> None:
        start = allocation.start
        if not self._starts or start > self._starts[-1]:
            self._starts.append(start)        # the common case: addresses only grow
        else:
            bisect.insort(self._starts, start)
        self._by_start[start] = allocation
        self._freed.pop(start, None)
        if self.usage is not None:
            usage = self.usage.setdefault(allocation.api, [0, 0])
            usage[0] += allocation.reserved
            usage[1] = max(usage[1], usage[0])

    def get(self, start: int) -> Allocation | None:
        """The live allocation that starts exactly at `start`."""
        return self._by_start.get(start)

    def freeable(self, pointer: int, call: str, owner: str) -> Allocation:
        """The live allocation `call(pointer)` may release; MemoryFreeError (nothing changed) for
        a double free, an interior or unknown pointer, or the wrong free call."""
        allocation = self.get(pointer)
        if allocation is None:
            raise MemoryFreeError(f"{call}(0x{pointer:x}): {self.explain_bad_free(pointer, call, owner)}")
        if allocation.free_api != call:
            raise MemoryFreeError(
                f"{call}(0x{pointer:x}): {allocation.describe()} came from {allocation.api}; "
                f"release it with {allocation.free_api}")
        return allocation

    def explain_bad_free(self, pointer: int, call: str, owner: str) -> str:
        """Why `call(pointer)` cannot free anything: double free, interior pointer, or unknown."""
        freed = self._freed.get(pointer)
        if freed is not None:
            return f"double free of {freed.describe()}"
        inside = self.containing(pointer)
        if inside is not None:
            return (f"points {pointer - inside.start} bytes into {inside.describe()}; "
                    f"{call} takes the start address")
        return f"not memory from {owner}; " + self.explain_miss(pointer, 0)

    def remove(self, start: int) -> Allocation:
        allocation = self._by_start.pop(start)
        del self._starts[bisect.bisect_left(self._starts, start)]
        allocation.live = False
        if self.usage is not None:
            self.usage[allocation.api][0] -= allocation.reserved
        RELEASES.bump()
        self._freed[start] = allocation
        if len(self._freed) > self._remembered_frees:
            self._freed.popitem(last=False)
        return allocation

    def live(self) -> list[Allocation]:
        return [self._by_start[s] for s in self._starts]

    def containing(self, address: int) -> Allocation | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            allocation = self._by_start[self._starts[i]]
            if address < allocation.end or (allocation.size == 0 and address == allocation.start):
                return allocation
        return None

    def check_range(self, address: int, nbytes: int, what: str) -> tuple[Allocation, int]:
        """The live allocation holding [address, address + nbytes) and the offset into it.

        Raises MemoryAccessError naming the address, the nearest allocation and the distance.
        """
        allocation = self.containing(address)
        if allocation is not None:
            if address + nbytes <= allocation.end:
                return allocation, address - allocation.start
            overrun = address + nbytes - allocation.end
            raise MemoryAccessError(
                f"{what}: {nbytes} bytes at 0x{address:x} run {overrun} bytes past the end of "
                f"{allocation.describe()} (offset {address - allocation.start}, "
                f"only {allocation.end - address} bytes left)"
            )
        raise MemoryAccessError(f"{what}: {self.explain_miss(address, nbytes)}")

    def freed_containing(self, address: int) -> Allocation | None:
        """The most recently freed allocation (of those remembered) holding `address`."""
        freed = self._freed.get(address)
        if freed is not None:
            return freed
        for freed in reversed(self._freed.values()):
            if freed.start <= address < freed.start + max(freed.size, 1):
                return freed
        return None

    def explain_miss(self, address: int, nbytes: int) -> str:
        freed = self.freed_containing(address)
        if freed is not None:
            return (f"0x{address:x} (+{nbytes} bytes) is inside {freed.describe()}: "
                    "use after free")
        return f"0x{address:x} (+{nbytes} bytes) is not inside any live allocation; " + self._nearest(address)

    def _nearest(self, address: int) -> str:
        i = bisect.bisect_right(self._starts, address)
        candidates = []
        if i > 0:
            before = self._by_start[self._starts[i - 1]]
            candidates.append((address - before.end, f"{address - before.end + 1} bytes past the "
                               f"last byte of {before.describe()}"))
        if i < len(self._starts):
            after = self._by_start[self._starts[i]]
            candidates.append((after.start - address, f"{after.start - address} bytes before "
                               f"{after.describe()}"))
        if not candidates:
            return "there are no live allocations"
        return "it is " + min(candidates)[1]


def summarize(allocations: list[Allocation], limit: int = 10) -> str:
    """A short multi-line list of allocations for leak reports."""
    total = sum(a.size for a in allocations)
    lines = [f"{len(allocations)} live allocation(s), {format_size(total)} in total:"]
    lines += [f"  {a.api} allocation 0x{a.start:x} of {a.size} bytes (#{a.seq})"
              for a in allocations[:limit]]
    if len(allocations) > limit:
        lines.append(f"  ... and {len(allocations) - limit} more")
    return "\n".join(lines)
