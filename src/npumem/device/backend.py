"""The device backend interface: the only layer that touches device bytes.

A backend owns device memory for one or more devices. The runtime validates API arguments and
calls the backend to reserve and release memory, to resolve a pointer range to the allocation
that holds it (the sanitizer check), to move and fill bytes, and to report memory info.

Subclasses implement the abstract methods. The byte movers (`write`, `read`, `copy`, `fill`) have
defaults for backends whose memory is visible to the host process through `Allocation.host_address`
(the simulator, torch on cpu); a backend whose memory is not (a GPU) overrides them.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

from ..constants import DEVICE_START_ALIGN, MallocPolicy, MemAttr
from ..errors import FeatureNotSupportedError, MemoryAccessError
from .address_index import Allocation
from .backing import allocate_bytes
from .sanitizer import SANITIZER, stale_use

if TYPE_CHECKING:
    import numpy as np


# DLPack device types (dlpack.h): where a consumer of exported tensors finds the bytes.
DLPACK_CPU, DLPACK_CUDA, DLPACK_EXT_DEV = 1, 2, 12


class DeviceRange(NamedTuple):
    """`nbytes` bytes at `offset` inside a live `allocation`: the result of a bounds check."""

    allocation: Allocation
    offset: int
    nbytes: int
    block: Allocation | None = None     # the pool block it lies in (the pool sanitizer's)

    @property
    def address(self) -> int:
        return self.allocation.start + self.offset

    def host_address(self, what: str) -> int:
        """Where these bytes live in this process; fails if the allocation (or the pool block)
        was freed meanwhile."""
        if self.block is not None:
            self._check_block(what)
        if not self.allocation.live:
            raise MemoryAccessError(
                f"{what}: 0x{self.address:x} (+{self.nbytes} bytes) is inside "
                f"{self.allocation.describe()}: use after free (it was freed while the work "
                "was queued)"
            )
        return self.allocation.host_address + self.offset

    def hold(self, what: str) -> tuple[object, int]:
        """(the buffer, the host address of these bytes). Whoever keeps the buffer keeps the
        bytes mapped, so a free that races with a copy cannot unmap them under it."""
        buffer = self.allocation.buffer       # taken before the check: a later free cannot unmap
        address = self.host_address(what)     # raises once the allocation is freed
        if buffer is None:                    # freed between the two lines above
            raise MemoryAccessError(f"{what}: 0x{self.address:x} (+{self.nbytes} bytes) was "
                                    "freed while the work was queued (use after free)")
        return buffer, address

    def _check_block(self, what: str) -> None:
        error = stale_use(self.block, what, self.address, self.nbytes)
        if error is not None:
            raise error

    def check_not_freed(self, what: str) -> None:
        """Raise if the allocation was freed while work on it ran (the work itself was safe:
        it held the bytes)."""
        if self.block is not None:
            self._check_block(what)
        if not self.allocation.live:
            raise MemoryAccessError(
                f"{what}: {self.allocation.describe()} was freed while the work on it ran "
                "(use after free): free it after synchronizing its stream")


class DeviceBackend(ABC):
    """What the runtime needs from a device. See the module docstring for the contract."""

    name: str = "abstract"

    @property
    @abstractmethod
    def device_count(self) -> int:
        """How many devices this backend drives (ids 0 .. device_count - 1)."""

    @abstractmethod
    def allocate(self, device: int, size: int, reserved: int, policy: MallocPolicy,
                 api: str) -> Allocation:
        """Reserve `reserved` bytes on `device`, of which the first `size` are usable.

        The start is aligned to at least 128 bytes. Raises MemoryAllocationError with the numbers
        when the device cannot hold it; on failure nothing changes.
        """

    @abstractmethod
    def free(self, pointer: int, api: str) -> Allocation:
        """Release the allocation starting at `pointer`, made by the family of `api`.

        Raises MemoryFreeError (double free, unknown pointer, wrong free call) and changes
        nothing then.
        """

    @abstractmethod
    def resolve(self, pointer: int, nbytes: int, what: str) -> DeviceRange:
        """The live allocation holding [pointer, pointer + nbytes); MemoryAccessError if none."""

    @abstractmethod
    def is_device_pointer(self, pointer: int) -> bool:
        """Whether `pointer` lies in any device's address range (live or not)."""

    @abstractmethod
    def device_of(self, pointer: int) -> int:
        """The device whose address range holds `pointer`."""

    @abstractmethod
    def mem_info(self, device: int, attr: MemAttr) -> tuple[int, int]:
        """(free, total) bytes of the memory `attr` names on `device`."""

    @abstractmethod
    def live_allocations(self, device: int) -> list[Allocation]:
        """Allocations on `device` not yet freed, oldest address first."""

    # Virtual memory (optional): reserve an address range, back pages of it on demand.
    supports_virtual_memory = False
    page_granularity = 2 << 20

    def reserve(self, device: int, nbytes: int) -> Allocation:
        """Reserve `nbytes` of address space on `device` with no memory behind it yet.

        Released with `free(start, "release")`, which also returns any pages still mapped.
        """
        raise FeatureNotSupportedError(f"the {self.name} backend has no virtual memory")

    def map(self, reservation: Allocation, offset: int, nbytes: int) -> None:
        """Back [offset, offset + nbytes) of a reservation with pages (granularity-aligned)."""
        raise FeatureNotSupportedError(f"the {self.name} backend has no virtual memory")

    def unmap(self, reservation: Allocation, offset: int, nbytes: int) -> None:
        """Return the pages behind [offset, offset + nbytes) of a reservation."""
        raise FeatureNotSupportedError(f"the {self.name} backend has no virtual memory")

    def allocate_host(self, nbytes: int) -> np.ndarray:
        """`nbytes` of 64-byte aligned host memory for malloc_host. Backends whose device copies
        are faster from page-locked memory (cuda) return page-locked bytes."""
        return allocate_bytes(nbytes, DEVICE_START_ALIGN)

    def register_host(self, device: int, host: Allocation, offset: int, nbytes: int) -> Allocation:
        """Give [offset, offset + nbytes) of pinned host allocation `host` a device address.

        The device reads and writes the host bytes themselves (zero copy). Released with
        `free(start, "host_unregister")`.
        """
        raise FeatureNotSupportedError(f"the {self.name} backend cannot map host memory")

    def release_device(self, device: int) -> list[Allocation]:
        """Free everything still allocated on `device` (reset_device); returns what was live."""
        live = self.live_allocations(device)
        for allocation in live:
            self.free(allocation.start, allocation.free_api)
        return live

    def close(self) -> None:
        """Release every device's memory (finalize)."""
        for device in range(self.device_count):
            self.release_device(device)

    @staticmethod
    def device_range(allocation: Allocation, offset: int, nbytes: int, what: str) -> DeviceRange:
        """The range, checked against the pool's blocks when a pool carves the allocation and
        the pool sanitizer is on."""
        rng = DeviceRange(allocation, offset, nbytes)
        if allocation.pool is not None and SANITIZER.on:
            return SANITIZER.check(rng, what)
        return rng

    def native_pointer(self, pointer: int) -> int:
        """Where the bytes at npumem device pointer `pointer` really are (for foreign libraries)."""
        return self.resolve(pointer, 0, "native_pointer").host_address("native_pointer")

    def dlpack_device(self, device: int) -> tuple[int, int]:
        """(DLPack device type, id) under which `device`'s bytes are exported;
        DLPACK_EXT_DEV means no consumer can read them in place."""
        return DLPACK_EXT_DEV, device

    def adopt(self, obj) -> Allocation | None:
        """An allocation over a foreign tensor on this backend's device (no copy; released with
        free(start, "release_tensor")), or None when `obj` is not one this backend adopts."""
        return None

    def stream_runner(self, device: int):
        """How a stream's worker runs each task on `device` (None: just call it).

        Backends with device streams return `run(task)`, which issues the task's work on a
        stream of their own and returns once the device has finished it."""
        return None

    # Byte movers for host-visible memory.

    def kernel_view(self, rng: DeviceRange, what: str):
        """The bytes of a device range as the array type this backend's kernels take."""
        return self.host_view(rng, what)

    def host_view(self, rng: DeviceRange, what: str) -> "np.ndarray":
        """The bytes of a device range as a writable uint8 array (host-visible backends only);
        the view keeps them mapped (raises on use after free)."""
        buffer, _ = rng.hold(what)
        return buffer[rng.offset:rng.offset + rng.nbytes]

    # Each mover holds the buffers it touches while it runs: a free from another thread during
    # a long copy then leaves the bytes mapped until the copy ends, and is reported after it.

    def write(self, dst: DeviceRange, src_address: int) -> None:
        """Host bytes at `src_address` -> device range."""
        held, address = dst.hold("copy to device")
        ctypes.memmove(address, src_address, dst.nbytes)
        dst.check_not_freed("copy to device")

    def read(self, dst_address: int, src: DeviceRange) -> None:
        """Device range -> host bytes at `dst_address`."""
        held, address = src.hold("copy from device")
        ctypes.memmove(dst_address, address, src.nbytes)
        src.check_not_freed("copy from device")

    def copy(self, dst: DeviceRange, src: DeviceRange) -> None:
        """Device range -> device range (same or different device); overlap is allowed."""
        held_dst, target = dst.hold("device copy destination")
        held_src, source = src.hold("device copy source")
        ctypes.memmove(target, source, dst.nbytes)
        src.check_not_freed("device copy source")
        dst.check_not_freed("device copy destination")

    def fill(self, dst: DeviceRange, value: int) -> None:
        """Set every byte of the range to `value` (0..255)."""
        held, address = dst.hold("memset")
        ctypes.memset(address, value, dst.nbytes)
        dst.check_not_freed("memset")
