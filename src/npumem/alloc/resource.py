"""The memory resource interface (after RAPIDS RMM) and the plain device resource.

A resource hands out device pointers with `allocate(nbytes, stream)` and takes them back with
`deallocate(pointer, nbytes, stream)`. Adaptors wrap an upstream resource to add statistics,
tracking, logging or a limit; the caching pool is a resource; so is the driver itself. Every
resource must be safe to call from several threads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..constants import MallocPolicy
from ..device.backend import DeviceBackend
from ..units import carve_size


class MemoryResource(ABC):
    """What every allocator in npumem implements.

    Subclasses implement `allocate` and `deallocate`. `allocate` raises a MemoryAllocationError
    (OutOfMemoryError for pools) when it cannot serve the request and changes nothing then;
    `deallocate` raises MemoryFreeError for pointers it did not hand out.
    """

    @abstractmethod
    def allocate(self, nbytes: int, stream=None) -> int:
        """A device pointer to at least `nbytes` usable bytes, ordered on `stream`."""

    @abstractmethod
    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        """Give back memory from `allocate`. `nbytes`, when given, must match the request."""

    @property
    def upstream(self) -> "MemoryResource | None":
        """The wrapped resource, for adaptors; None for a base resource."""
        return None

    def owns(self, pointer: int) -> bool:
        """Whether `pointer` is currently allocated from this resource."""
        return False


class DeviceResource(MemoryResource):
    """Every request straight to the device (aclrtMalloc / aclrtFree), no caching."""

    def __init__(self, backend: DeviceBackend, device: int = 0,
                 policy: MallocPolicy = MallocPolicy.HUGE_FIRST):
        self.backend, self.device, self.policy = backend, device, policy
        self._live: dict[int, int] = {}

    def allocate(self, nbytes: int, stream=None) -> int:
        reserved = carve_size(max(nbytes, 1))       # aclrtMalloc's size rule
        pointer = self.backend.allocate(self.device, max(nbytes, 1), reserved, self.policy, "malloc").start
        self._live[pointer] = nbytes
        return pointer

    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        self.backend.free(pointer, "free")
        self._live.pop(pointer, None)

    def owns(self, pointer: int) -> bool:
        return pointer in self._live
