"""The simulated NPU: real bytes, CANN's size and page rules, and a sanitizer's eye.

Each device owns a slice of npumem's device address space (`address_space`): device pointers
never look like host pointers, and a stale pointer is reported as use after free.

Configuration (environment, read at `init`): NPUMEM_SIM_DEVICES (default 1), NPUMEM_SIM_MEMORY
per device (default 32GiB), NPUMEM_SIM_HUGE_MEMORY (how much of it may be mapped as 2 MiB huge
pages, default all), NPUMEM_SIM_MEMORY_KIND (hbm or ddr, default hbm).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..constants import HUGE_PAGE_SIZE, MallocPolicy, MemAttr
from ..errors import (
    InvalidDeviceError, InvalidParamError, MemoryAccessError, MemoryAllocationError,
    MemoryFreeError,
)
from ..units import GiB, align_up, format_size, parse_size
from .address_index import RELEASES, AddressIndex, Allocation
from .address_space import MAX_DEVICES, AddressSpace, device_of, in_device_space
from .backend import DeviceBackend, DeviceRange
from .backing import address_of, allocate_bytes, release_pages
from .environment import setting
from .pages import PAGE_SIZE, PageAccounting

# Which free call releases memory made by which allocation call (default: free).
FREE_CALL = {"dvpp_malloc": "dvpp_free", "reserve": "release", "host_register": "host_unregister"}

_MEMORY_ATTRS = {
    "hbm": (MemAttr.HBM_MEM, MemAttr.HBM_MEM_HUGE, MemAttr.HBM_MEM_NORMAL),
    "ddr": (MemAttr.DDR_MEM, MemAttr.DDR_MEM_HUGE, MemAttr.DDR_MEM_NORMAL),
}


@dataclass(frozen=True)
class SimConfig:
    """Shape of the simulated machine."""

    devices: int = 1
    memory: int = 32 * GiB
    huge_memory: int | None = None     # huge-page limit; default: all of `memory`
    memory_kind: str = "hbm"

    def __post_init__(self) -> None:
        if not 1 <= self.devices <= MAX_DEVICES:
            raise InvalidParamError(f"simulated device count must be 1..{MAX_DEVICES}, got {self.devices}")
        if self.memory < 4096:
            raise InvalidParamError(f"simulated device memory must be at least 4 KiB, got {self.memory} bytes")
        if self.memory_kind not in _MEMORY_ATTRS:
            raise InvalidParamError(f"simulated memory kind must be 'hbm' or 'ddr', got {self.memory_kind!r}")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "SimConfig":
        def read(name: str, parse, default):
            return setting(name, parse, default, environ)

        return cls(
            devices=read("NPUMEM_SIM_DEVICES", int, 1),
            memory=read("NPUMEM_SIM_MEMORY", parse_size, 32 * GiB),
            huge_memory=read("NPUMEM_SIM_HUGE_MEMORY", parse_size, None),
            memory_kind=read("NPUMEM_SIM_MEMORY_KIND", str.lower, "hbm"),
        )


class SimDevice:
    """One simulated device: its address range, page pools and live allocations."""

    def __init__(self, index: int, config: SimConfig):
        self.index = index
        self.addresses = AddressSpace(index)
        self.pages = PageAccounting(config.memory, config.huge_memory)
        self.allocations = AddressIndex(track_usage=True)
        self.lock = threading.RLock()

    def allocate(self, size: int, reserved: int, policy: MallocPolicy, api: str) -> Allocation:
        with self.lock:
            kind = self.pages.take(reserved, policy)
            if kind is None:
                raise MemoryAllocationError(self._no_room_message(size, reserved, policy, api))
            try:
                buffer = allocate_bytes(reserved)
            except (MemoryError, OSError) as exc:
                self.pages.give_back(kind, reserved)
                raise MemoryAllocationError(
                    f"{api}({size}): the simulator could not back {format_size(reserved)} with "
                    f"host memory ({exc}); lower NPUMEM_SIM_MEMORY or free host RAM"
                ) from None
            try:
                start = self.addresses.claim(self.pages.cost(kind, reserved), PAGE_SIZE[kind], api)
            except MemoryAllocationError:
                self.pages.give_back(kind, reserved)
                raise
            allocation = Allocation(start=start, size=size, reserved=reserved, api=api,
                                    device=self.index, buffer=buffer,
                                    host_address=address_of(buffer), page_kind=kind,
                                    free_api=FREE_CALL.get(api, "free"))
            self.allocations.add(allocation)
            return allocation

    def _no_room_message(self, size: int, reserved: int, policy: MallocPolicy, api: str) -> str:
        pages = self.pages
        state = ", ".join(
            f"{kind} pages: {format_size(pages.available(kind))} available of "
            f"{format_size(pages.capacity(kind))}" for kind in pages.candidates(reserved, policy)
        )
        hint = ""
        if policy.name.startswith("HUGE_ONLY") and pages.cost("normal", reserved) <= pages.free:
            hint = "; normal pages could hold it: use HUGE_FIRST to fall back to them"
        return (
            f"{api}({size}) on device {self.index} needs {reserved} bytes "
            f"({format_size(reserved)}) under {policy.name}: {state}; "
            f"device total {format_size(self.pages.total)}, {format_size(self.pages.free)} free{hint}"
        )

    def free(self, pointer: int, api: str) -> Allocation:
        with self.lock:
            allocation = self.allocations.freeable(pointer, api, f"device {self.index}")
            if allocation.api == "reserve":
                self.unmap(allocation, 0, allocation.size)
            self.allocations.remove(pointer)
            self.addresses.release(pointer)
            if allocation.page_kind:
                self.pages.give_back(allocation.page_kind, allocation.reserved)
            else:                         # registered host memory: it costs the device no pages
                allocation.extra["host"].extra["registered"].remove(pointer)
            allocation.buffer = None      # the bytes go back to the OS once no view holds them
            return allocation

    def register_host(self, host: Allocation, offset: int, nbytes: int) -> Allocation:
        """Map `nbytes` of pinned host memory into this device's address space (zero copy)."""
        with self.lock:
            start = self.addresses.claim(nbytes, 64, "host_register")
            allocation = Allocation(start=start, size=nbytes, reserved=0, api="host_register",
                                    device=self.index, buffer=host.buffer[offset:offset + nbytes],
                                    host_address=host.host_address + offset,
                                    free_api="host_unregister", extra={"host": host})
            self.allocations.add(allocation)
            host.extra.setdefault("registered", []).append(start)
            return allocation

    def resolve(self, pointer: int, nbytes: int, what: str) -> DeviceRange:
        with self.lock:
            allocation, offset = self.allocations.check_range(pointer, nbytes, what)
            if allocation.api == "reserve" and nbytes:
                self._check_mapped(allocation, offset, nbytes, what)
        return DeviceBackend.device_range(allocation, offset, nbytes, what)

    # --- virtual memory: a reservation is address space whose huge pages come and go ---------

    def reserve(self, nbytes: int) -> Allocation:
        size = align_up(max(nbytes, 1), HUGE_PAGE_SIZE)
        with self.lock:
            start = self.addresses.claim(size, HUGE_PAGE_SIZE, f"reserve({nbytes})")
            buffer = allocate_bytes(size)           # lazily backed: costs RAM only when written
            allocation = Allocation(start=start, size=size, reserved=0, api="reserve",
                                    device=self.index, buffer=buffer,
                                    host_address=address_of(buffer), page_kind="huge",
                                    free_api="release")
            allocation.extra["mapped"] = bytearray(size // HUGE_PAGE_SIZE)
            self.allocations.add(allocation)
            return allocation

    def _pages(self, reservation: Allocation, offset: int, nbytes: int, what: str) -> range:
        if reservation.api != "reserve" or not reservation.live:
            raise InvalidParamError(f"{what}: {reservation.describe()} is not a live reservation")
        if offset % HUGE_PAGE_SIZE or nbytes % HUGE_PAGE_SIZE or offset < 0 or \
                offset + nbytes > reservation.size:
            raise InvalidParamError(
                f"{what}: [{offset}, {offset + nbytes}) must be {HUGE_PAGE_SIZE}-byte aligned and "
                f"inside the {reservation.size}-byte reservation"
            )
        return range(offset // HUGE_PAGE_SIZE, (offset + nbytes) // HUGE_PAGE_SIZE)

    def map(self, reservation: Allocation, offset: int, nbytes: int) -> None:
        with self.lock:
            mapped = reservation.extra["mapped"]
            missing = [page for page in self._pages(reservation, offset, nbytes, "map") if not mapped[page]]
            need = len(missing) * HUGE_PAGE_SIZE
            if self.pages.take(need, MallocPolicy.HUGE_ONLY) is None:
                raise MemoryAllocationError(
                    f"map of {format_size(nbytes)} at offset {offset} of {reservation.describe()} "
                    f"needs {format_size(need)} of huge pages; "
                    f"{format_size(self.pages.available('huge'))} available of "
                    f"{format_size(self.pages.capacity('huge'))} on device {self.index}"
                )
            for page in missing:
                mapped[page] = 1
            reservation.reserved += need

    def unmap(self, reservation: Allocation, offset: int, nbytes: int) -> None:
        with self.lock:
            mapped = reservation.extra["mapped"]
            pages = [page for page in self._pages(reservation, offset, nbytes, "unmap") if mapped[page]]
            if pages:
                RELEASES.bump()
            for page in pages:
                mapped[page] = 0
                release_pages(reservation.buffer, page * HUGE_PAGE_SIZE, HUGE_PAGE_SIZE)
            self.pages.give_back("huge", len(pages) * HUGE_PAGE_SIZE)
            reservation.reserved -= len(pages) * HUGE_PAGE_SIZE

    @staticmethod
    def _check_mapped(reservation: Allocation, offset: int, nbytes: int, what: str) -> None:
        mapped = reservation.extra["mapped"]
        first, last = offset // HUGE_PAGE_SIZE, (offset + nbytes - 1) // HUGE_PAGE_SIZE
        for page in range(first, last + 1):
            if not mapped[page]:
                raise MemoryAccessError(
                    f"{what}: {nbytes} bytes at 0x{reservation.start + offset:x} touch the unmapped "
                    f"page at 0x{reservation.start + page * HUGE_PAGE_SIZE:x} of {reservation.describe()}"
                )

    def memory_info(self, attr: MemAttr, memory_kind: str) -> tuple[int, int]:
        """(free, total): the whole memory, or what huge / normal pages could still take."""
        whole, huge, normal = _MEMORY_ATTRS[memory_kind]
        with self.lock:
            if attr == whole:
                return self.pages.free, self.pages.total
            page_kind = {huge: "huge", normal: "normal"}.get(attr)
            if page_kind is None:
                return 0, 0           # this device has no memory of that kind
            return self.pages.available(page_kind), self.pages.capacity(page_kind)


class SimBackend(DeviceBackend):
    """The default backend: simulated NPUs in this process."""

    name = "sim"
    supports_virtual_memory = True

    def __init__(self, config: SimConfig | None = None, **overrides):
        if config is None:
            config = SimConfig(**overrides) if overrides else SimConfig.from_env()
        self.config = config
        self.devices = [SimDevice(i, config) for i in range(config.devices)]

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def _device(self, device: int) -> SimDevice:
        if not 0 <= device < len(self.devices):
            raise InvalidDeviceError(
                f"device {device} does not exist; the simulator has {len(self.devices)} "
                f"device(s), ids 0..{len(self.devices) - 1} (set NPUMEM_SIM_DEVICES for more)"
            )
        return self.devices[device]

    def allocate(self, device, size, reserved, policy, api):
        return self._device(device).allocate(size, reserved, policy, api)

    def free(self, pointer, api):
        if not self.is_device_pointer(pointer):
            raise MemoryFreeError(f"{api}(0x{pointer:x}): not a device address")
        return self.devices[self.device_of(pointer)].free(pointer, api)

    def resolve(self, pointer, nbytes, what):
        if not self.is_device_pointer(pointer):
            raise MemoryAccessError(f"{what}: 0x{pointer:x} is not a device address")
        return self.devices[self.device_of(pointer)].resolve(pointer, nbytes, what)

    def is_device_pointer(self, pointer):
        return in_device_space(pointer, len(self.devices))

    # the address space's function itself: one call less on every caching_allocator_delete
    device_of = staticmethod(device_of)

    def reserve(self, device, nbytes):
        return self._device(device).reserve(nbytes)

    def register_host(self, device, host, offset, nbytes):
        return self._device(device).register_host(host, offset, nbytes)

    def map(self, reservation, offset, nbytes):
        self.devices[reservation.device].map(reservation, offset, nbytes)

    def unmap(self, reservation, offset, nbytes):
        self.devices[reservation.device].unmap(reservation, offset, nbytes)

    def mem_info(self, device, attr):
        return self._device(device).memory_info(attr, self.config.memory_kind)

    def live_allocations(self, device):
        sim_device = self._device(device)
        with sim_device.lock:
            return sim_device.allocations.live()
