"""DLPack import without copies: `from_dlpack` (the export side is `dlpack_capsule`).

CPU memory from numpy or torch is mapped into the current device's address space (zero copy);
on a torch backend, torch tensors on its device are adopted in place. The producer is kept alive
for as long as a tensor uses its memory. `from_dlpack` of an npumem tensor is a view of the same
storage.
"""

from __future__ import annotations

import ctypes
import weakref

from ..device.address_index import Allocation
from ..device.backend import DLPACK_CPU
from ..device.backing import host_bytes
from ..errors import OpParamError
from ..runtime.state import RUNTIME
from .dlpack_capsule import _DTYPES, _Managed, _api, dlpack_device, to_dlpack
from .tensor import Storage, Tensor, contiguous_strides, reach

__all__ = ["dlpack_device", "from_dlpack", "map_host_memory", "to_dlpack"]


def from_dlpack(obj) -> Tensor:
    """An npumem tensor over the same bytes as `obj` (anything with `__dlpack__`)."""
    if isinstance(obj, Tensor):
        return Tensor(obj.storage, obj.shape, obj.strides, obj.storage_offset, obj.dtype,
                      obj.format, obj.storage_shape)
    if not hasattr(obj, "__dlpack__"):
        raise OpParamError(f"from_dlpack: {type(obj).__name__} does not support DLPack")
    RUNTIME.lazy_context()                       # starts the runtime on first use
    adopted = RUNTIME.backend.adopt(obj)
    if adopted is not None:
        return _adopted_tensor(obj, adopted)
    capsule = obj.__dlpack__()
    if not _api.PyCapsule_IsValid(capsule, b"dltensor"):
        raise OpParamError("from_dlpack: expected an unused 'dltensor' capsule")
    managed = ctypes.cast(_api.PyCapsule_GetPointer(capsule, b"dltensor"),
                          ctypes.POINTER(_Managed)).contents
    dl = managed.dl_tensor
    if dl.device.device_type != DLPACK_CPU:
        raise OpParamError(f"from_dlpack: memory on DLPack device type {dl.device.device_type} "
                           "cannot be used by this backend; npumem imports CPU memory")
    try:
        dtype = _DTYPES[(dl.dtype.code, dl.dtype.bits)]
    except KeyError:
        raise OpParamError(f"from_dlpack: unsupported DLPack dtype code {dl.dtype.code} with "
                           f"{dl.dtype.bits} bits") from None
    if dl.dtype.lanes != 1:
        raise OpParamError("from_dlpack: vector (multi-lane) dtypes are not supported")
    shape = [dl.shape[i] for i in range(dl.ndim)]
    itemsize = dl.dtype.bits // 8
    strides = [dl.strides[i] for i in range(dl.ndim)] if dl.strides else contiguous_strides(shape)
    nbytes = reach(shape, strides) * itemsize
    address = dl.data + dl.byte_offset
    # Consume the capsule: from now on we own the producer's reference and call its deleter.
    _api.PyCapsule_SetName(capsule, b"used_dltensor")
    keeper = _ProducerRef(ctypes.addressof(managed), managed.deleter)
    storage = map_host_memory(address, max(nbytes, itemsize), keeper)
    return Tensor(storage, shape, strides, 0, dtype)


class _ProducerRef:
    """Calls the producer's deleter once nothing of ours uses its memory any more."""

    def __init__(self, managed_address: int, deleter):
        self.managed_address, self.deleter = managed_address, deleter

    # Held on the class: the last reference may go at interpreter exit, after this module's
    # globals (ctypes among them) were cleared, and the producer must still get its memory back.
    _cast, _pointer = staticmethod(ctypes.cast), ctypes.POINTER(_Managed)

    def __del__(self):
        if self.deleter:
            self.deleter(self._cast(self.managed_address, self._pointer))


def map_host_memory(address: int, nbytes: int, owner) -> Storage:
    """Storage on the current device over `nbytes` of host memory at `address` (zero copy).

    `owner` is kept alive until the mapping is gone.
    """
    device = RUNTIME.current_context().device
    view = host_bytes(address, nbytes)
    host = Allocation(start=address, size=nbytes, reserved=nbytes, api="dlpack import",
                      device=-1, buffer=view, host_address=address, extra={"owner": owner})
    mapped = RUNTIME.backend.register_host(device, host, 0, nbytes)
    storage = Storage(mapped.start, nbytes, device, host_address=address)
    weakref.finalize(storage, _unmap, mapped.start, host)
    return storage


def _unmap(pointer: int, host: Allocation) -> None:
    """Drop the mapping (and with `host`, the producer) unless its device already did."""
    backend = RUNTIME.backend
    if backend is not None and pointer in host.extra.get("registered", ()):
        backend.free(pointer, "host_unregister")



def _adopted_tensor(source, adopted: Allocation) -> Tensor:
    """An npumem tensor over a torch tensor the backend adopted in place."""
    from .views import data_type_of_torch

    storage = Storage(adopted.start, adopted.size, adopted.device)
    weakref.finalize(storage, _release_adopted, adopted)
    return Tensor(storage, list(source.shape), list(source.stride()), 0,
                  data_type_of_torch(source.dtype))


def _release_adopted(allocation: Allocation) -> None:
    backend = RUNTIME.backend
    if backend is not None and allocation.live:
        backend.free(allocation.start, "release_tensor")
