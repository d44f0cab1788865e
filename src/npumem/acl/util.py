"""`acl.util`: converting between host pointers, numpy arrays and bytes, as pyACL does.

These take and return host pointers only: a simulated device pointer is not host memory, and is
refused with a clear error instead of being dereferenced.
"""

from __future__ import annotations

import threading
import warnings
import weakref

import numpy as np

from ..device.backing import address_of, host_bytes
from ..errors import InvalidParamError
from ..runtime.hostmem import PINNED
from ..runtime.state import RUNTIME
from ._result import code_of, values_and_code

# numpy type numbers, as pyACL's ptr_to_numpy takes them (11 = float32, 23 = float16, ...).
_DTYPE_BY_NUMBER = {np.dtype(t).num: np.dtype(t) for t in set(np.sctypeDict.values())
                    if np.dtype(t).kind in "biufc"}


def _array(array, what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise InvalidParamError(f"{what}: expected a numpy array, got {type(array).__name__}; "
                                "wrap it with np.array(...) (and keep that array alive)")
    return array


def numpy_to_ptr(array: np.ndarray) -> int:
    """The host address of an array's data. A non-contiguous array's first element is returned
    too, as pyACL does, with a warning: a copy through it reads the array's raw memory, not its
    elements in order (numpy_contiguous_to_ptr makes it contiguous first)."""
    array = _array(array, "numpy_to_ptr")
    if not array.flags.c_contiguous:
        warnings.warn("numpy_to_ptr: the array is not C-contiguous; the pointer is to its raw "
                      "memory (use numpy_contiguous_to_ptr or np.ascontiguousarray)",
                      RuntimeWarning, stacklevel=2)
    return address_of(array)


# A contiguous copy lives as long as the array it was made from (arrays are not hashable:
# keyed by id, and dropped by a finalizer on the array).
_contiguous_copies: dict[int, np.ndarray] = {}


def numpy_contiguous_to_ptr(array: np.ndarray) -> int:
    """The host address of a C-contiguous version of `array`: the array itself when it is
    contiguous, else a contiguous copy kept alive as long as `array`."""
    array = _array(array, "numpy_contiguous_to_ptr")
    if array.flags.c_contiguous:
        return address_of(array)
    copy = _contiguous_copies.get(id(array))
    if copy is None:
        copy = _contiguous_copies[id(array)] = np.ascontiguousarray(array)
        weakref.finalize(array, _contiguous_copies.pop, id(array), None)
    return address_of(copy)


_threads: dict[int, threading.Thread] = {}


def start_thread(function, args_list) -> tuple[int, int]:
    """(thread id, ret): run `function(*args_list)` on a new thread, as pyACL's start_thread
    (the thread a callback subscription names)."""
    def start() -> int:
        if not callable(function):
            raise InvalidParamError(f"start_thread: expected a function, got "
                                    f"{type(function).__name__}")
        args = list(args_list) if isinstance(args_list, (list, tuple)) else [args_list]
        thread = threading.Thread(target=function, args=args, name="npumem-acl-thread",
                                  daemon=True)
        thread.start()
        _threads[thread.ident] = thread
        return thread.ident
    return values_and_code(start)


def stop_thread(thread_id: int) -> int:
    """Wait for a thread from start_thread to return (its function must end on its own)."""
    def stop() -> None:
        thread = _threads.pop(thread_id, None)
        if thread is None:
            raise InvalidParamError(f"stop_thread: {thread_id!r} is not a thread from start_thread")
        thread.join()
    return code_of(stop)


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
