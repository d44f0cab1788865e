"""npumem device addresses: one 4 PiB slice of a 64-bit space per device, far above any host address.

Both backends hand out these addresses, whatever holds the bytes (simulated memory, a torch
tensor on a GPU): a device pointer can never be mistaken for a host pointer, and addresses come
from a bump pointer and are never reused, so a stale pointer always lands in a freed range and is
reported as use after free instead of silently hitting a newer allocation.
"""

from __future__ import annotations

from ..errors import MemoryAllocationError
from ..units import align_up

ADDRESS_BASE = 1 << 60
DEVICE_SPAN = 1 << 52
MAX_DEVICES = 64


class AddressSpace:
    """One device's slice of addresses."""

    def __init__(self, index: int):
        self.index = index
        self.base = ADDRESS_BASE + index * DEVICE_SPAN
        self._next = self.base

    def claim(self, nbytes: int, align: int, what: str) -> int:
        """The next `align`-aligned start for `nbytes`; addresses are never handed out twice.

        Callers hold their device's lock."""
        start = align_up(self._next, align)
        if start + nbytes > self.base + DEVICE_SPAN:
            raise MemoryAllocationError(f"{what}: device {self.index} has no address space left")
        self._next = start + nbytes
        return start


def in_device_space(pointer: int, devices: int) -> bool:
    """Whether `pointer` lies in the slice of one of `devices` devices (live or not)."""
    return ADDRESS_BASE <= pointer < ADDRESS_BASE + devices * DEVICE_SPAN


def device_of(pointer: int) -> int:
    """The device whose slice holds `pointer`."""
    return (pointer - ADDRESS_BASE) // DEVICE_SPAN
