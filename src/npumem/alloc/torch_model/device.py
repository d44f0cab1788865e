"""The driver under the PyTorch allocator model: cudaMalloc/cudaFree and the virtual-memory
calls behind expandable segments, with a capacity.

Addresses are the driver's choice, not the allocator's, yet they decide best-fit ties. When the
model replays a recording, the driver hands out the addresses the recording shows for the same
requests (`expect`), so a faithful model lands every block where the real one did; any other
request gets a fresh address in a range no recorded address uses (below 2**53, where
JavaScript viewers still read addresses exactly).
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import deque

from .blocks import Block

GiB = 1 << 30
FRESH_BASE = 0x10_0000_0000_0000          # 2**52: above CUDA's user range, below 2**53


class DeviceMemory:
    """Physical memory of one device: `capacity` bytes (None: unlimited) for the allocator."""

    def __init__(self, capacity: int | None = None, fresh_base: int = FRESH_BASE):
        self.capacity = capacity
        self.used = 0
        self._fresh = fresh_base
        self._ranges: list[tuple[int, int]] = []          # (start, end) of live allocations
        self._expected: dict[str, deque] = {"malloc": deque(), "reserve": deque()}

    # --- addresses ------------------------------------------------------------------------
    def expect(self, kind: str, addr: int, size: int) -> None:
        """The recording's next `malloc` (segment_alloc) or address `reserve` (first
        segment_map of a new expandable segment) was at `addr`."""
        self._expected[kind].append((addr, size))

    def _address(self, kind: str, size: int, match_size: bool = True) -> int:
        expected = self._expected[kind]
        if expected and (not match_size or expected[0][1] == size):
            addr = expected.popleft()[0]
            if not self._overlaps(addr, addr + size):
                return addr
        addr = self._fresh
        self._fresh += (size + 2 * (1 << 20) - 1) // (2 << 20) * (2 << 20) + (2 << 20)
        return addr

    def _overlaps(self, start: int, end: int) -> bool:
        index = bisect_right(self._ranges, (start, 1 << 64))
        if index and self._ranges[index - 1][1] > start:
            return True
        return index < len(self._ranges) and self._ranges[index][0] < end

    def _claim(self, start: int, size: int) -> None:
        insort(self._ranges, (start, start + size))

    def claim(self, start: int, size: int) -> None:
        """A segment that was already allocated when the recording began."""
        self._claim(start, size)
        self.used += size

    def _release(self, start: int) -> None:
        index = bisect_right(self._ranges, (start, 1 << 64)) - 1
        del self._ranges[index]

    # --- physical memory ------------------------------------------------------------------
    def free_bytes(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.used

    def fits(self, size: int) -> bool:
        return self.capacity is None or self.used + size <= self.capacity

    def malloc(self, size: int) -> int | None:
        """cudaMalloc: an address, or None when the device is full."""
        if not self.fits(size):
            return None
        addr = self._address("malloc", size)
        self._claim(addr, size)
        self.used += size
        return addr

    def free(self, addr: int, size: int) -> None:
        self._release(addr)
        self.used -= size

    def reserve(self, size: int, at: int | None = None) -> int:
        """cuMemAddressReserve: address space only (`at`: where a recording shows it)."""
        addr = self._address("reserve", size, match_size=False) if at is None else at
        self._claim(addr, size)
        return addr

    def unreserve(self, addr: int) -> None:
        self._release(addr)


class ExpandableSegment:
    """One stream's growing address range; physical pages of `page` bytes mapped on demand.

    It keeps no state per page: the allocator maps only ranges it knows are unmapped and unmaps
    only mapped ones, so the device's bytes in use say all the pages need. (A list of pages,
    sized by the addresses a file names, cost gigabytes on a 5 KB snapshot: issue 64.)"""

    def __init__(self, device: DeviceMemory, stream: int, page: int, address_space: int,
                 base: int | None = None):
        self.device, self.stream, self.page = device, stream, page
        self.max_pages = -(-address_space // page)
        self.base = device.reserve(self.max_pages * page, at=base)
        self._marked_end = 0            # pages below it were marked mapped (restored)

    def _pages(self, ptr: int, size: int) -> tuple[int, int]:
        return (ptr - self.base) // self.page, -(-(ptr + size - self.base) // self.page)

    def mark_mapped(self, ptr: int, size: int) -> None:
        """Pages a recording shows mapped before it began. Ranges come in address order, so
        the pages an earlier one marked past this one's start are those below _marked_end."""
        begin, end = self._pages(ptr, size)
        begin = max(begin, self._marked_end)
        if end > begin:
            self.device.used += (end - begin) * self.page
            self._marked_end = end

    @property
    def size(self) -> int:
        return self.max_pages * self.page

    def map(self, ptr: int, size: int) -> tuple[int, int]:
        """Map the pages under [ptr, ptr+size); (start, 0) when the device has no room (the
        driver maps page by page, fails at the first past the capacity, and the call undoes
        what it mapped: all or nothing)."""
        begin, end = self._pages(ptr, size)
        mapped = (end - begin) * self.page
        if begin == end or not self.device.fits(mapped):
            return self.base + begin * self.page, 0
        self.device.used += mapped
        return self.base + begin * self.page, mapped

    def unmap(self, ptr: int, size: int) -> tuple[int, int]:
        """Unmap the pages lying wholly inside [ptr, ptr+size)."""
        begin = -(-(ptr - self.base) // self.page)
        end = (ptr + size - self.base) // self.page
        if begin >= end:
            return ptr, 0
        self.device.used -= (end - begin) * self.page
        return self.base + begin * self.page, (end - begin) * self.page

    def release(self) -> None:
        self.device.unreserve(self.base)

    def whole(self, pool, stream: int) -> Block:
        """The unmapped block covering the whole address range."""
        return Block(self.base, self.size, stream, pool, segment=self, mapped=False)
