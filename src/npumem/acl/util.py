"""`acl.util`: converting between host pointers, numpy arrays and bytes, as pyACL does.

These take and return host pointers only: a simulated device pointer is not host memory, and is
refused with a clear error instead of being dereferenced.
"""

from __future__ import annotations


import numpy as np

from ..device.backing import address_of, host_bytes
from ..errors import InvalidParamError
from ..runtime.hostmem import PINNED
from ..runtime.state import RUNTIME

# numpy type numbers, as pyACL's ptr_to_numpy takes them (11 = float32, 23 = float16, ...).
_DTYPE_BY_NUMBER = {np.dtype(t).num: np.dtype(t) for t in set(np.sctypeDict.values())
                    if np.dtype(t).kind in "biufc"}


def numpy_to_ptr(array: np.ndarray) -> int:
    """The host address of a (contiguous) array's data."""
    if not array.flags.c_contiguous:
        raise InvalidParamError("numpy_to_ptr: the array is not contiguous; use np.ascontiguousarray")
    return address_of(array)


def bytes_to_ptr(data) -> int:
    """The host address of a bytes-like object's buffer (valid while the object lives)."""
    return address_of(np.frombuffer(data, dtype=np.uint8))


def _host_bytes(pointer: int, nbytes: int, what: str) -> np.ndarray:
    if not isinstance(pointer, int) or pointer <= 0:
        raise InvalidParamError(f"{what}: {pointer!r} is not a host pointer")
    backend = RUNTIME.backend
    if backend is not None and backend.is_device_pointer(pointer):
        raise InvalidParamError(f"{what}: 0x{pointer:x} is device memory, which the host cannot "
                                "read directly; copy it to the host with memcpy first")
    pinned = PINNED.find(pointer)
    if pinned is not None:
        offset = pointer - pinned.start
        if offset + nbytes > pinned.size:
            raise InvalidParamError(f"{what}: {nbytes} bytes at 0x{pointer:x} run "
                                    f"{offset + nbytes - pinned.size} bytes past {pinned.describe()}")
        return pinned.buffer[offset:offset + nbytes]      # keeps the pinned buffer alive
    return host_bytes(pointer, nbytes)


def ptr_to_numpy(pointer: int, shape, np_type: int) -> np.ndarray:
    """An array viewing host memory at `pointer` (no copy); np_type is a numpy type number."""
    dtype = _DTYPE_BY_NUMBER.get(np_type)
    if dtype is None:
        raise InvalidParamError(f"ptr_to_numpy: unknown numpy type number {np_type} "
                                "(11 = float32, 23 = float16, 5 = int32, ...)")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return _host_bytes(pointer, nbytes, "ptr_to_numpy").view(dtype).reshape(shape)


def ptr_to_bytes(pointer: int, size: int) -> bytes:
    """A copy of `size` host bytes at `pointer`."""
    return _host_bytes(pointer, size, "ptr_to_bytes").tobytes()
