"""Pinned host memory (malloc_host / free_host) and the reading of host-side arguments.

Host arguments may be numpy arrays, any bytes-like object, or integer host pointers. Pinned
allocations are real, 64-byte aligned host buffers registered in an `AddressIndex`, so a pointer
into them is bounds-checked like device memory. Freed pinned buffers stay in a bounded
quarantine (their bytes kept, so no one else gets their addresses): a stale pointer into one is
a use-after-free error, not a write into someone's heap. A raw pointer into other host memory
is trusted as the C runtime trusts it, once it is known to be mapped (`host_maps`).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import numpy as np

from ..constants import DEVICE_START_ALIGN
from ..device.address_index import AddressIndex, Allocation
from ..device.backing import address_of, allocate_bytes
from ..errors import InvalidParamError, MemoryAccessError, MemoryFreeError
from .host_maps import is_mapped


QUARANTINE_BYTES = 256 << 20          # freed pinned memory kept back, oldest released first


class PinnedHostMemory:
    """Registry of page-locked host buffers handed out by malloc_host."""

    def __init__(self, quarantine_bytes: int = QUARANTINE_BYTES):
        self.index = AddressIndex()
        self.lock = threading.Lock()
        self.quarantine_bytes = quarantine_bytes
        self._quarantine: collections.deque[Allocation] = collections.deque()   # oldest first
        self._quarantined = 0
        self._freed = AddressIndex()      # the quarantine by address, for stale pointers

    def allocate(self, size: int, backend=None) -> Allocation:
        """`backend.allocate_host` gives the bytes where a backend is given (cuda pins them)."""
        buffer = backend.allocate_host(size) if backend else allocate_bytes(size, DEVICE_START_ALIGN)
        start = address_of(buffer)
        allocation = Allocation(start=start, size=size, reserved=size, api="malloc_host",
                                device=-1, buffer=buffer, host_address=start,
                                free_api="free_host")
        with self.lock:
            self.index.add(allocation)
        return allocation

    def free(self, pointer: int) -> Allocation:
        with self.lock:
            allocation = self.index.get(pointer)
            if allocation is None:
                reason = self.index.explain_bad_free(pointer, "free_host", "malloc_host")
                raise MemoryFreeError(f"free_host(0x{pointer:x}): {reason}")
            if allocation.extra.get("registered"):
                mapped = ", ".join(f"0x{d:x}" for d in allocation.extra["registered"])
                raise MemoryFreeError(f"free_host(0x{pointer:x}): {allocation.describe()} is still "
                                      f"mapped into device memory at {mapped}; host_unregister it first")
            self.index.remove(pointer)
            self._hold_back(allocation)
        return allocation

    def _hold_back(self, allocation: Allocation) -> None:
        """Keep a freed buffer's bytes (so its addresses are not handed to anyone else) until
        newer frees push it out of the quarantine (call with the lock held)."""
        self._quarantine.append(allocation)
        self._freed.add(allocation)
        self._quarantined += allocation.size
        self._release_quarantine(down_to=self.quarantine_bytes)

    def _release_quarantine(self, down_to: int) -> None:
        """Let the oldest quarantined buffers go until at most `down_to` bytes are held."""
        while self._quarantined > down_to and self._quarantine:
            oldest = self._quarantine.popleft()
            self._freed.remove(oldest.start)
            self._quarantined -= oldest.size
            oldest.buffer = None          # the bytes go back to the OS now

    def find_freed(self, address: int) -> Allocation | None:
        """The freed pinned allocation, still in quarantine, that holds `address`."""
        with self.lock:
            return self._freed.containing(address)

    def find(self, address: int) -> Allocation | None:
        with self.lock:
            return self.index.containing(address)

    def live(self) -> list[Allocation]:
        with self.lock:
            return self.index.live()

    def release_all(self) -> list[Allocation]:
        """Free everything (finalize), the quarantine included; returns what was still live."""
        live = self.live()
        for allocation in live:
            self.free(allocation.start)
        with self.lock:
            self._release_quarantine(down_to=0)
        return live


PINNED = PinnedHostMemory()


@dataclass
class HostRange:
    """`nbytes` host bytes at `address`; `keep` holds the Python object that owns them."""

    address: int
    nbytes: int
    pinned: Allocation | None
    keep: object = None

    def check_live(self, what: str) -> None:
        """For pinned memory used by queued work: it must not have been freed meanwhile."""
        if self.pinned is not None and not self.pinned.live:
            raise MemoryAccessError(f"{what}: 0x{self.address:x} is inside "
                                    f"{self.pinned.describe()}: use after free")


def host_range(obj, nbytes: int, what: str, writable: bool) -> HostRange:
    """Resolve a host argument (array, bytes-like or pointer) holding at least `nbytes`."""
    if isinstance(obj, bool):
        raise InvalidParamError(f"{what}: expected a host pointer, array or bytes-like object, got a bool")
    if isinstance(obj, int):
        if obj <= 0:
            raise InvalidParamError(f"{what}: null or negative host pointer {obj}")
        pinned = PINNED.find(obj)
        if pinned is not None:
            if obj + nbytes > pinned.end:
                raise MemoryAccessError(
                    f"{what}: {nbytes} bytes at 0x{obj:x} run {obj + nbytes - pinned.end} bytes past "
                    f"the end of {pinned.describe()}"
                )
        else:
            freed = PINNED.find_freed(obj)
            if freed is not None:
                raise MemoryAccessError(f"{what}: 0x{obj:x} is inside {freed.describe()}, released "
                                        "with free_host: use after free")
            if nbytes and not is_mapped(obj, nbytes, writable):
                raise MemoryAccessError(f"{what}: {nbytes} bytes at host address 0x{obj:x} are not "
                                        f"{'writable' if writable else 'readable'} memory of this "
                                        "process (a stale or made-up pointer?)")
        return HostRange(obj, nbytes, pinned)
    array = _as_byte_array(obj, what, writable)
    if array.nbytes < nbytes:
        raise InvalidParamError(f"{what}: the host buffer holds {array.nbytes} bytes, "
                                f"{nbytes} are needed")
    address = address_of(array)
    return HostRange(address, nbytes, PINNED.find(address), keep=obj)


def _as_byte_array(obj, what: str, writable: bool) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        array = obj
    else:
        try:
            array = np.frombuffer(obj, dtype=np.uint8)
        except (TypeError, ValueError, BufferError):
            raise InvalidParamError(
                f"{what}: expected a host pointer (int), numpy array or bytes-like object, "
                f"got {type(obj).__name__}"
            ) from None
    if not array.flags.c_contiguous:
        raise InvalidParamError(f"{what}: the host array is not contiguous; pass np.ascontiguousarray(...)")
    if writable and not array.flags.writeable:
        raise InvalidParamError(f"{what}: the host buffer is read-only ({type(obj).__name__}); "
                                "use a bytearray or a writable numpy array")
    return array


class KnownHostBuffers:
    """Host buffers whose addresses npumem handed out (acl.util's numpy_to_ptr, bytes_to_ptr,
    ...), each with the Python object that owns the bytes.

    A raw integer is only safe to dereference while its owner lives. The registry holds a
    strong reference to each owner, so an address it knows stays valid; an owner that only the
    registry still references has been dropped by the program (its pointer is dangling) and is
    pruned before every look-up, so a stale pointer is refused rather than read.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[int, list] = {}          # id(owner) -> [start, end, owner, writable]
        self._dropped = self._refs([0, 0, object(), False])   # refcount of an unreferenced owner

    @staticmethod
    def _refs(entry: list) -> int:
        import sys
        return sys.getrefcount(entry[2])

    def add(self, owner, start: int, nbytes: int, writable: bool) -> None:
        with self._lock:
            self._prune()
            entry = self._entries.get(id(owner))
            if entry is not None and entry[2] is owner:
                entry[0], entry[1] = min(entry[0], start), max(entry[1], start + nbytes)
            else:
                self._entries[id(owner)] = [start, start + nbytes, owner, writable]

    def find(self, address: int, nbytes: int) -> tuple[object, bool] | None:
        """(owner, writable) of a live buffer holding [address, address + nbytes), or None."""
        with self._lock:
            self._prune()
            for start, end, owner, writable in self._entries.values():
                if start <= address and address + nbytes <= end:
                    return owner, writable
        return None

    def _prune(self) -> None:
        dropped = [key for key, entry in self._entries.items() if self._refs(entry) <= self._dropped]
        for key in dropped:
            del self._entries[key]

    def __len__(self) -> int:
        with self._lock:
            self._prune()
            return len(self._entries)


KNOWN_HOST = KnownHostBuffers()
