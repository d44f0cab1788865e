"""npumem device addresses: one 64 TiB slice per device, above every host address and below
2**53.

Both backends hand out these addresses, whatever holds the bytes (simulated memory, a torch
tensor on a GPU): a device pointer can never be mistaken for a host pointer (user space ends
below 2**48 on x86-64 and arm64), and every address is a number JavaScript holds exactly, so
PyTorch's MemoryViz page and Perfetto place npumem's blocks where they are. Addresses come from
a bump pointer, so a stale pointer lands in a freed range and is reported as use after free
instead of silently hitting a newer allocation; only when a device's slice is used up does the
pointer go round and reuse freed ranges, oldest addresses first.
"""

from __future__ import annotations

import bisect

from ..errors import MemoryAllocationError
from ..units import align_up

ADDRESS_BASE = 1 << 48
DEVICE_SPAN = 1 << 46
MAX_DEVICES = 64                   # ADDRESS_BASE + MAX_DEVICES * DEVICE_SPAN < 2**53
# the most memory a device holds with room for eight streams: a caching pool reserves a range
# of the whole memory per stream (as c10's expandable segments do), and more finds no addresses
MAX_DEVICE_MEMORY = DEVICE_SPAN // 8


class AddressSpace:
    """One device's slice of addresses, and which ranges of it are claimed."""

    def __init__(self, index: int, span: int = DEVICE_SPAN):
        self.index = index
        self.base = ADDRESS_BASE + index * DEVICE_SPAN
        self.end = self.base + span
        self._next = self.base
        self._starts: list[int] = []             # claimed ranges, sorted by start
        self._ends: dict[int, int] = {}

    def claim(self, nbytes: int, align: int, what: str) -> int:
        """The next `align`-aligned start for `nbytes` (callers hold their device's lock)."""
        start = self._fit(align_up(self._next, align), nbytes, align)
        if start is None:                        # the slice is used up: go round
            start = self._fit(align_up(self.base, align), nbytes, align)
        if start is None:
            raise MemoryAllocationError(f"{what}: device {self.index} has no {nbytes}-byte range "
                                        f"of address space left")
        if not self._starts or start > self._starts[-1]:
            self._starts.append(start)
        else:
            bisect.insort(self._starts, start)
        self._ends[start] = start + max(nbytes, 1)
        self._next = start + nbytes
        return start

    def release(self, start: int) -> None:
        """The range claimed at `start` may be handed out again once the slice is used up."""
        if self._ends.pop(start, None) is not None:
            del self._starts[bisect.bisect_left(self._starts, start)]

    def _fit(self, start: int, nbytes: int, align: int) -> int | None:
        """The first aligned start at or after `start` whose range overlaps no claimed one."""
        while start + nbytes <= self.end:
            i = bisect.bisect_right(self._starts, start)
            if i and self._ends[self._starts[i - 1]] > start:          # inside a claimed range
                start = align_up(self._ends[self._starts[i - 1]], align)
            elif i < len(self._starts) and self._starts[i] < start + nbytes:   # runs into one
                start = align_up(self._ends[self._starts[i]], align)
            else:
                return start
        return None


def in_device_space(pointer: int, devices: int) -> bool:
    """Whether `pointer` lies in the slice of one of `devices` devices (live or not)."""
    return ADDRESS_BASE <= pointer < ADDRESS_BASE + devices * DEVICE_SPAN


def device_of(pointer: int) -> int:
    """The device whose slice holds `pointer`."""
    return (pointer - ADDRESS_BASE) // DEVICE_SPAN
