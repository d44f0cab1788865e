"""Real bytes for simulated memory, backed lazily by the operating system.

Large buffers are anonymous private mappings with MAP_NORESERVE: the kernel hands out a page only
when it is first touched, so a 30 GiB allocation that is never written costs no RAM, and dropping
the last reference unmaps it at once. Small buffers come from numpy's heap, because one mapping
each would run into the kernel's limit on the number of mappings (vm.max_map_count, ~65k).
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np

# Not exported by Python's mmap module before 3.12; the value is the same on every Linux arch.
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
MMAP_THRESHOLD = 1 << 20


def allocate_bytes(nbytes: int, align: int = 64) -> np.ndarray:
    """A writable uint8 array of `nbytes` whose first byte is `align`-aligned (align <= 4096)."""
    if nbytes >= MMAP_THRESHOLD:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
        return np.frombuffer(mapping, dtype=np.uint8)  # page-aligned; the array keeps it mapped
    raw = np.empty(nbytes + align, dtype=np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip:skip + nbytes]


def host_bytes(address: int, nbytes: int) -> np.ndarray:
    """`nbytes` of process memory at `address` as a uint8 array (a view, no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


def address_of(buffer: np.ndarray) -> int:
    """The process address of a buffer's first byte."""
    return buffer.__array_interface__["data"][0]


def release_pages(buffer: np.ndarray, offset: int, nbytes: int) -> None:
    """Give the RAM behind part of a mapped buffer back to the OS (it reads as zeros after)."""
    mapping = buffer.base.obj if isinstance(buffer.base, memoryview) else None
    if isinstance(mapping, mmap.mmap):
        mapping.madvise(mmap.MADV_DONTNEED, offset, nbytes)
