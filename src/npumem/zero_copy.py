"""Zero-copy memory (seed 000's ZeroCopyMemory): pinned host bytes with a device address.

    with npumem.ZeroCopyMemory(1 << 20) as zc:
        x = zc.tensor((256, 256), "float")       # a device tensor over the host bytes
        np.asarray(x)[:] = 1                      # the host writes them in place
        ... ops read x and write results into another zero-copy tensor; no memcpy happens ...

malloc_host pins the pages, host_register gives them a device address; close() undoes both.
`npumem.copy_stats()` shows what this saves: work on these tensors moves 0 bytes.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import OpParamError
from .dtypes import as_data_type, numpy_dtype
from .ops.tensor import Tensor, contiguous_strides, create_tensor
from .runtime import memory as rt_memory
from .runtime.hostmem import PINNED
from .units import align_up


class ZeroCopyMemory:
    """`size` bytes the host and the current device share. Carve tensors out of it in order."""

    def __init__(self, size: int):
        self.size = size
        self.host_ptr = rt_memory.malloc_host(size)
        try:
            self.device_ptr = rt_memory.host_register(self.host_ptr, size)
        except BaseException:
            rt_memory.free_host(self.host_ptr)
            raise
        self._host = PINNED.find(self.host_ptr).buffer[:size]
        self._next = 0            # bytes handed out by tensor()/array()

    @property
    def host(self) -> np.ndarray:
        """All the bytes, as the host sees them (uint8)."""
        return self._host

    def tensor(self, shape, dtype="float") -> Tensor:
        """The next 64-byte aligned piece as a device tensor (host-visible: np.asarray works)."""
        dtype, shape = as_data_type(dtype), tuple(shape)
        item = numpy_dtype(dtype).itemsize
        offset = align_up(self._next, 64)
        nbytes = math.prod(shape) * item
        if offset + nbytes > self.size:
            raise OpParamError(f"zero-copy memory of {self.size} bytes has {self.size - offset} "
                               f"left; a {shape} {dtype.name.lower()} tensor needs {nbytes}")
        self._next = offset + nbytes
        return create_tensor(shape, dtype, contiguous_strides(shape), offset // item,
                             data_ptr=self.device_ptr, storage_shape=(self.size // item,))

    def close(self) -> None:
        """Unmap from the device and free the pinned memory (tensors over it become invalid)."""
        if self.host_ptr:
            rt_memory.host_unregister(self.device_ptr)
            rt_memory.free_host(self.host_ptr)
            self.host_ptr = self.device_ptr = 0

    def __enter__(self) -> "ZeroCopyMemory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<npumem ZeroCopyMemory {self.size} bytes: host 0x{self.host_ptr:x}, "
                f"device 0x{self.device_ptr:x}>")
