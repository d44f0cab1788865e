"""The torch backend: device memory from PyTorch on `cuda`, `npu` (torch_npu) or `cpu`.

Each npumem allocation is one uint8 tensor made by PyTorch on the device (so on a GPU the bytes
come through PyTorch's own caching allocator); npumem's pool sub-allocates inside those tensors.
Pointers are npumem device addresses (`address_space`), as on the simulator, so the runtime's
checks (bounds, use after free, host vs device) work the same; `native_pointer` gives the real
address for libraries that want one (CuPy, custom kernels). Copies and fills run as torch ops on
views of those tensors; so do the built-in ops (`ops/torch_kernels.py`).

Streams: on cuda and npu each npumem stream owns a torch stream; its worker thread issues the
stream's work on it and waits for the device before it reports the work done, so events, stream
synchronization and the pool's stream-ordered reuse mean what they say. On cpu the workers are
the streams.

Limits: NPUMEM_TORCH_MEMORY (or `memory=`) caps what npumem takes per device; the default is the
device's total memory (physical RAM on cpu). NPUMEM_TORCH_DEVICES sets how many logical devices
`torch:cpu` shows (default 1), for multi-device code on one host. There is no virtual memory, so
the pool uses plain segments. Host memory is mapped into the device (zero copy) on cpu and cuda
(`cuda_host`: malloc_host is page-locked there); on npu it must be copied. Memory info reports the
device memory as HBM.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

import numpy as np

from ..constants import DEVICE_START_ALIGN, MallocPolicy, MemAttr
from ..errors import (
    FeatureNotSupportedError, InvalidDeviceError, InvalidParamError, MemoryAccessError,
    MemoryAllocationError, MemoryFreeError,
)
from ..units import format_size, parse_size
from . import cuda_host
from .address_index import AddressIndex, Allocation
from .address_space import MAX_DEVICES, AddressSpace, device_of, in_device_space
from .backend import DLPACK_CPU, DLPACK_CUDA, DeviceBackend, DeviceRange
from .backing import host_bytes
from .environment import setting

DEVICE_TYPES = ("cpu", "cuda", "npu")
START_ALIGN = 4096             # npumem addresses of torch allocations start on a 4 KiB page
_HBM = (MemAttr.HBM_MEM, MemAttr.HBM_MEM_HUGE, MemAttr.HBM_MEM_NORMAL)


def import_torch():
    """PyTorch, or a clear error naming the extra that installs it."""
    try:
        import torch
    except ImportError:
        raise FeatureNotSupportedError(
            "the torch backend needs PyTorch: pip install 'npumem[torch]'") from None
    return torch


class TorchDevice:
    """One device: its torch device, address slice, live allocations and the bytes it holds."""

    def __init__(self, index: int, torch_device, limit: int):
        self.index = index
        self.torch_device = torch_device
        self.addresses = AddressSpace(index)
        self.allocations = AddressIndex(track_usage=True)
        self.limit = limit
        self.used = 0
        self.lock = threading.RLock()


class TorchBackend(DeviceBackend):
    """Device memory from PyTorch. `TorchBackend("cuda")`, `TorchBackend("cpu", devices=2)`."""

    def __init__(self, device_type: str = "cpu", *, devices: int | None = None,
                 memory: int | None = None):
        if device_type not in DEVICE_TYPES:
            raise InvalidParamError(f"torch device type must be one of {', '.join(DEVICE_TYPES)}, "
                                    f"got {device_type!r}")
        torch = self.torch = import_torch()
        if device_type == "npu":
            try:
                import torch_npu  # noqa: F401 - registers torch.npu
            except ImportError:
                raise FeatureNotSupportedError(
                    "torch:npu needs torch_npu, Ascend's PyTorch adapter (pip install torch-npu)"
                ) from None
        self.device_type = device_type
        self.name = f"torch:{device_type}"
        self.module = torch.get_device_module(device_type)
        if memory is None:
            memory = setting("NPUMEM_TORCH_MEMORY", parse_size, None)
        count = self._count(devices)
        self.devices = [TorchDevice(i, torch.device(device_type, i if device_type != "cpu" else None),
                                    self._limit(i, memory)) for i in range(count)]

    def _count(self, devices: int | None) -> int:
        if self.device_type == "cpu":
            count = devices or setting("NPUMEM_TORCH_DEVICES", int, 1)
            if not 1 <= count <= MAX_DEVICES:
                raise InvalidParamError(f"torch:cpu device count must be 1..{MAX_DEVICES}, got {count}")
            return count
        if not self.module.is_available():
            raise FeatureNotSupportedError(f"{self.name}: PyTorch sees no {self.device_type} device "
                                           "on this machine; use torch:cpu or sim")
        available = self.module.device_count()
        if devices is not None and not 1 <= devices <= available:
            raise InvalidParamError(f"{self.name}: asked for {devices} devices, PyTorch sees {available}")
        return devices or available

    def _limit(self, index: int, memory: int | None) -> int:
        total = self._physical_total(index)
        if memory is not None and memory <= 0:
            raise InvalidParamError(f"{self.name}: memory limit must be positive, got {memory}")
        return total if memory is None else min(memory, total)

    def _physical_total(self, index: int) -> int:
        if self.device_type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return self.module.mem_get_info(index)[1]

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def _device(self, device: int) -> TorchDevice:
        if not isinstance(device, int) or not 0 <= device < len(self.devices):
            raise InvalidDeviceError(f"device {device} does not exist; {self.name} has "
                                     f"{len(self.devices)} device(s), ids 0..{len(self.devices) - 1}")
        return self.devices[device]

    # --- allocations ------------------------------------------------------------------------

    def allocate(self, device: int, size: int, reserved: int, policy: MallocPolicy,
                 api: str) -> Allocation:
        dev = self._device(device)
        with dev.lock:
            if dev.used + reserved > dev.limit:
                raise MemoryAllocationError(self._no_room(dev, size, reserved, api))
            try:
                tensor = self.torch.empty(reserved, dtype=self.torch.uint8, device=dev.torch_device)
            except (RuntimeError, MemoryError) as exc:      # torch.OutOfMemoryError is one
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise MemoryAllocationError(
                    f"{self._no_room(dev, size, reserved, api)}; PyTorch refused: {reason}") from None
            start = dev.addresses.claim(reserved, START_ALIGN, api)
            allocation = Allocation(
                start=start, size=size, reserved=reserved, api=api, device=device, buffer=tensor,
                host_address=tensor.data_ptr() if self.device_type == "cpu" else 0,
                page_kind="device", free_api="dvpp_free" if api == "dvpp_malloc" else "free")
            dev.allocations.add(allocation)
            dev.used += reserved
            return allocation

    def _no_room(self, dev: TorchDevice, size: int, reserved: int, api: str) -> str:
        free, total = self.mem_info(dev.index, MemAttr.HBM_MEM)
        return (f"{api}({size}) on {self.name} device {dev.index} ({dev.torch_device}) needs "
                f"{reserved} bytes ({format_size(reserved)}): npumem holds {format_size(dev.used)} "
                f"of its {format_size(dev.limit)} limit, {format_size(free)} free of "
                f"{format_size(total)} (raise NPUMEM_TORCH_MEMORY or free memory)")

    def register_tensor(self, device: int, tensor, api: str, free_api: str,
                        extra: dict | None = None) -> Allocation:
        """Give the bytes of a contiguous torch tensor on this device an npumem address (no copy).

        The allocation keeps `tensor` alive until it is freed with `free_api`."""
        dev = self._device(device)
        flat = tensor.reshape(-1).view(self.torch.uint8) if tensor.numel() else \
            self.torch.empty(0, dtype=self.torch.uint8, device=dev.torch_device)
        if flat.device != dev.torch_device:
            raise InvalidParamError(f"{api}: the tensor is on {flat.device}, device {device} is "
                                    f"{dev.torch_device}")
        with dev.lock:
            start = dev.addresses.claim(max(flat.numel(), 1), 64, api)
            allocation = Allocation(
                start=start, size=flat.numel(), reserved=0, api=api, device=device, buffer=flat,
                host_address=flat.data_ptr() if self.device_type == "cpu" else 0,
                free_api=free_api, extra=extra or {})
            dev.allocations.add(allocation)
            return allocation

    def adopt(self, obj) -> Allocation | None:
        """Torch tensors on this backend's device (cuda, npu) are adopted in place; cpu memory
        comes in through `register_host` like any other host memory."""
        if not isinstance(obj, self.torch.Tensor) or self.device_type == "cpu" or \
                obj.device.type != self.device_type:
            return None
        device = next((d.index for d in self.devices if d.torch_device == obj.device), None)
        if device is None:
            raise InvalidParamError(f"from_dlpack: {obj.device} is not one of the {self.name} devices")
        span = 1 + sum((n - 1) * s for n, s in zip(obj.shape, obj.stride())) if obj.numel() else 0
        flat = obj.as_strided((span,), (1,))              # every element the view can reach
        return self.register_tensor(device, flat, "adopt_tensor", "release_tensor")

    def dlpack_device(self, device: int) -> tuple[int, int]:
        if self.device_type == "cpu":
            return DLPACK_CPU, 0
        if self.device_type == "cuda":
            return DLPACK_CUDA, self._device(device).torch_device.index
        return super().dlpack_device(device)

    def allocate_host(self, nbytes: int) -> np.ndarray:
        if self.device_type == "cuda":        # page-locked: copies are DMA, the GPU can map it
            buffer = cuda_host.pinned_host_bytes(self.torch, nbytes)
            if buffer.ctypes.data % DEVICE_START_ALIGN == 0:
                return buffer
        return super().allocate_host(nbytes)

    def register_host(self, device: int, host: Allocation, offset: int, nbytes: int) -> Allocation:
        if self.device_type == "cpu":
            tensor = self.torch.from_numpy(np.asarray(host.buffer[offset:offset + nbytes]))
        elif self.device_type == "cuda":
            tensor = cuda_host.device_view(self.torch, host.host_address + offset, nbytes,
                                           self._device(device).torch_device, owner=host)
        else:
            raise FeatureNotSupportedError(
                f"{self.name} cannot map host memory into the device; copy it with memcpy")
        allocation = self.register_tensor(device, tensor, "host_register", "host_unregister",
                                          {"host": host})
        allocation.host_address = host.host_address + offset     # the host sees it too
        host.extra.setdefault("registered", []).append(allocation.start)
        return allocation

    def free(self, pointer: int, api: str) -> Allocation:
        if not self.is_device_pointer(pointer):
            raise MemoryFreeError(f"{api}(0x{pointer:x}): not a device address")
        dev = self.devices[device_of(pointer)]
        with dev.lock:
            allocation = dev.allocations.freeable(pointer, api, f"device {dev.index}")
            dev.allocations.remove(pointer)
            dev.addresses.release(pointer)
            dev.used -= allocation.reserved
            host = allocation.extra.get("host")
            if host is not None:
                host.extra["registered"].remove(pointer)
            allocation.buffer = None          # PyTorch gets the bytes back once no view holds them
            return allocation

    def resolve(self, pointer: int, nbytes: int, what: str) -> DeviceRange:
        if not self.is_device_pointer(pointer):
            raise MemoryAccessError(f"{what}: 0x{pointer:x} is not a device address")
        dev = self.devices[device_of(pointer)]
        with dev.lock:
            allocation, offset = dev.allocations.check_range(pointer, nbytes, what)
        return self.device_range(allocation, offset, nbytes, what)

    def is_device_pointer(self, pointer: int) -> bool:
        return in_device_space(pointer, len(self.devices))

    # the address space's function itself: one call less on every caching_allocator_delete
    device_of = staticmethod(device_of)

    def live_allocations(self, device: int) -> list[Allocation]:
        dev = self._device(device)
        with dev.lock:
            return dev.allocations.live()

    def mem_info(self, device: int, attr: MemAttr) -> tuple[int, int]:
        dev = self._device(device)
        if attr not in _HBM:
            return 0, 0                      # torch devices report their memory as HBM
        free = dev.limit - dev.used
        if self.device_type != "cpu":        # what the device has, plus what torch caches unused
            device_free = self.module.mem_get_info(dev.index)[0]
            cached = self.module.memory_reserved(dev.index) - self.module.memory_allocated(dev.index)
            free = min(free, device_free + cached)
        return max(free, 0), dev.limit

    def native_pointer(self, pointer: int) -> int:
        """The real address (a CUDA/NPU device pointer, or a host address on cpu) of `pointer`."""
        rng = self.resolve(pointer, 0, "native_pointer")
        return rng.allocation.buffer.data_ptr() + rng.offset

    # --- bytes ------------------------------------------------------------------------------

    def tensor_view(self, rng: DeviceRange, what: str):
        """The bytes of a device range as a uint8 torch tensor on the device (no copy)."""
        rng.host_address(what)               # raises on use after free
        return rng.allocation.buffer[rng.offset:rng.offset + rng.nbytes]

    def kernel_view(self, rng: DeviceRange, what: str):
        return self.tensor_view(rng, what)

    def host_view(self, rng: DeviceRange, what: str) -> np.ndarray:
        if self.device_type != "cpu":
            raise FeatureNotSupportedError(f"{what}: {self.name} memory is not visible to the host; "
                                           "copy it with memcpy")
        return self.tensor_view(rng, what).numpy()

    def write(self, dst: DeviceRange, src_address: int) -> None:
        target = self.tensor_view(dst, "copy to device")
        target.copy_(self.torch.from_numpy(host_bytes(src_address, dst.nbytes)))

    def read(self, dst_address: int, src: DeviceRange) -> None:
        source = self.tensor_view(src, "copy from device")
        self.torch.from_numpy(host_bytes(dst_address, src.nbytes)).copy_(source)

    def copy(self, dst: DeviceRange, src: DeviceRange) -> None:
        target = self.tensor_view(dst, "device copy destination")
        source = self.tensor_view(src, "device copy source")
        if dst.allocation.buffer is src.allocation.buffer and \
                abs(dst.offset - src.offset) < dst.nbytes:
            source = source.clone()          # torch refuses copies between overlapping views
        target.copy_(source)
        self._finish(dst)

    def fill(self, dst: DeviceRange, value: int) -> None:
        self.tensor_view(dst, "memset").fill_(value)
        self._finish(dst)

    def _finish(self, rng: DeviceRange) -> None:
        """Wait for a kernel just queued on the current torch stream: a synchronous call must
        be done when it returns, and a stream task's work before its stream reports it done."""
        if self.device_type != "cpu":
            self.module.current_stream(rng.allocation.buffer.device).synchronize()

    # --- streams ----------------------------------------------------------------------------

    def stream_runner(self, device: int) -> Callable | None:
        if self.device_type == "cpu":
            return None
        module = self.module
        torch_stream = module.Stream(device=self._device(device).torch_device)

        def run(task) -> None:
            # Work the calling thread queued on torch's current stream (the tensors a task
            # reads through DLPack) comes first: a task run inline follows it at once.
            torch_stream.wait_stream(module.current_stream(torch_stream.device))
            try:
                with module.stream(torch_stream):
                    task()
            finally:
                torch_stream.synchronize()   # done on the worker means done on the device
        return run

