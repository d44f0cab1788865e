"""`acl.util`: converting between host pointers, numpy arrays and bytes, as pyACL does.

These take and return host pointers only, and only pointers npumem can vouch for: pinned
memory from malloc_host, or a buffer numpy_to_ptr / bytes_to_ptr handed out whose owner is
still alive (npumem holds it: `runtime.hostmem.KNOWN_HOST`). Anything else (a device pointer,
freed memory, a made-up integer) is refused with InvalidParamError (ACL_ERROR_INVALID_PARAM)
instead of being dereferenced, which could kill the process. Wrong types are refused the same
way, never with a TypeError.
"""

from __future__ import annotations

import threading
import warnings
import weakref

import numpy as np

import ctypes

from ..device.backing import address_of
from ..errors import AclError, InvalidParamError, integer_argument
from ..runtime.hostmem import KNOWN_HOST, PINNED
from ..runtime.state import RUNTIME
from ._result import WRONG_ARGUMENT, code_of, report_failure, values_and_code

# numpy type numbers, as pyACL's ptr_to_numpy takes them (11 = float32, 23 = float16, ...).
_DTYPE_BY_NUMBER = {np.dtype(t).num: np.dtype(t) for t in set(np.sctypeDict.values())
                    if np.dtype(t).kind in "biufc"}


def _converter(function):
    """Converters return values, as pyACL's do, so a refusal is raised: always an
    InvalidParamError (and this thread's last error), never a TypeError from below."""
    import functools

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except AclError as exc:
            report_failure(exc)
            raise
        except WRONG_ARGUMENT as exc:
            error = InvalidParamError(f"{function.__name__}: invalid argument "
                                      f"({type(exc).__name__}: {exc})")
            report_failure(error)
            raise error from None
    return call


def _array(array, what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise InvalidParamError(f"{what}: expected a numpy array, got {type(array).__name__}; "
                                "wrap it with np.array(...) (and keep that array alive)")
    return array


def _remember(array: np.ndarray, owner) -> int:
    """The address of `array`'s data, now known to the converters (with `owner` kept alive)."""
    start = address_of(array)
    span = _span(array)
    KNOWN_HOST.add(owner, start, span, bool(array.flags.writeable))
    return start


def _span(array: np.ndarray) -> int:
    """Bytes from the first element to past the last one (strides may skip, not go back)."""
    if array.size == 0:
        return 0
    last = sum((n - 1) * stride for n, stride in zip(array.shape, array.strides) if stride > 0)
    return last + array.itemsize


@_converter
def numpy_to_ptr(array: np.ndarray) -> int:
    """The host address of an array's data. A non-contiguous array's first element is returned
    too, as pyACL does, with a warning: a copy through it reads the array's raw memory, not its
    elements in order (numpy_contiguous_to_ptr makes it contiguous first)."""
    array = _array(array, "numpy_to_ptr")
    if not array.flags.c_contiguous:
        warnings.warn("numpy_to_ptr: the array is not C-contiguous; the pointer is to its raw "
                      "memory (use numpy_contiguous_to_ptr or np.ascontiguousarray)",
                      RuntimeWarning, stacklevel=3)
    return _remember(array, array)


# A contiguous copy lives as long as the array it was made from (arrays are not hashable:
# keyed by id, and dropped by a finalizer on the array).
_contiguous_copies: dict[int, np.ndarray] = {}


@_converter
def numpy_contiguous_to_ptr(array: np.ndarray) -> int:
    """The host address of a C-contiguous version of `array`: the array itself when it is
    contiguous, else a contiguous copy kept alive as long as `array`."""
    array = _array(array, "numpy_contiguous_to_ptr")
    if array.flags.c_contiguous:
        return _remember(array, array)
    copy = _contiguous_copies.get(id(array))
    if copy is None:
        copy = _contiguous_copies[id(array)] = np.ascontiguousarray(array)
        weakref.finalize(array, _contiguous_copies.pop, id(array), None)
    return _remember(copy, copy)


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


@_converter
def bytes_to_ptr(data) -> int:
    """The host address of a bytes-like object's buffer (valid while the object lives: npumem
    keeps it alive until the program drops it)."""
    if isinstance(data, (str, int, float, bool, type(None), list, tuple, dict)):
        raise InvalidParamError(f"bytes_to_ptr: expected bytes or another buffer (bytearray, "
                                f"memoryview, numpy array), got {type(data).__name__}")
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidParamError(f"bytes_to_ptr: {type(data).__name__} has no buffer to point "
                                "at; pass bytes, bytearray or a numpy array") from None
    if not view.c_contiguous:
        raise InvalidParamError("bytes_to_ptr: the buffer is not contiguous")
    array = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view,
                          dtype=np.uint8)
    KNOWN_HOST.add(data, address_of(array), array.nbytes, not view.readonly)
    return address_of(array)


def _host_view(pointer, nbytes, what: str, writable: bool = False) -> np.ndarray:
    """`nbytes` of host memory at `pointer` as a uint8 array that keeps its owner alive, once
    npumem knows the memory is live (and writable, when asked)."""
    pointer = integer_argument(pointer, f"{what}: ptr")
    nbytes = integer_argument(nbytes, f"{what}: size")
    if pointer <= 0:
        raise InvalidParamError(f"{what}: {pointer} is not a host pointer")
    if nbytes < 0:
        raise InvalidParamError(f"{what}: size must not be negative, got {nbytes}")
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
    freed = PINNED.find_freed(pointer)
    if freed is not None:
        raise InvalidParamError(f"{what}: 0x{pointer:x} is inside {freed.describe()}, released "
                                "with free_host: use after free")
    known = KNOWN_HOST.find(pointer, nbytes)
    if known is None:
        raise InvalidParamError(
            f"{what}: {nbytes} bytes at 0x{pointer:x} are not host memory npumem knows to be live "
            "(memory from malloc_host, or from numpy_to_ptr / bytes_to_ptr on an object still "
            "held); a stale or made-up pointer is refused rather than read")
    owner, owner_writable = known
    if writable and not owner_writable:
        raise InvalidParamError(f"{what}: 0x{pointer:x} is inside a read-only "
                                f"{type(owner).__name__}; writing there would change an "
                                "immutable object")
    cells = (ctypes.c_uint8 * nbytes).from_address(pointer)
    cells.owner = owner                       # the view keeps the owner (and its bytes) alive
    view = np.ctypeslib.as_array(cells) if nbytes else np.empty(0, np.uint8)
    if not owner_writable:
        view.flags.writeable = False
    return view


@_converter
def ptr_to_numpy(pointer: int, shape, np_type: int) -> np.ndarray:
    """An array viewing host memory at `pointer` (no copy); np_type is a numpy type number."""
    number = integer_argument(np_type, "ptr_to_numpy: np_type")
    dtype = _DTYPE_BY_NUMBER.get(number)
    if dtype is None:
        raise InvalidParamError(f"ptr_to_numpy: unknown numpy type number {number} "
                                "(11 = float32, 23 = float16, 5 = int32, ...)")
    if isinstance(shape, (list, tuple)):
        shape = tuple(integer_argument(n, "ptr_to_numpy: shape entry") for n in shape)
    else:
        shape = (integer_argument(shape, "ptr_to_numpy: shape"),)
    if any(n < 0 for n in shape):
        raise InvalidParamError(f"ptr_to_numpy: shape {shape} has a negative dimension")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return _host_view(pointer, nbytes, "ptr_to_numpy").view(dtype).reshape(shape)


@_converter
def ptr_to_bytes(pointer: int, size: int) -> bytes:
    """A copy of `size` host bytes at `pointer`."""
    return _host_view(pointer, size, "ptr_to_bytes").tobytes()


@_converter
def set_ptr_data(pointer: int, data) -> None:
    """Copy the bytes of `data` (bytes-like or a numpy array) into host memory at `pointer`,
    which must be writable memory npumem knows with room for all of them. (pyACL's reference
    does not document this call; npumem takes (ptr, data), mirroring ptr_to_bytes.)"""
    if isinstance(data, np.ndarray):
        source = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    elif isinstance(data, (bytes, bytearray, memoryview)):
        source = np.frombuffer(memoryview(data).cast("B") if isinstance(data, memoryview)
                               else data, dtype=np.uint8)
    else:
        raise InvalidParamError(f"set_ptr_data: data must be bytes, bytearray, memoryview or a "
                                f"numpy array, got {type(data).__name__}")
    target = _host_view(pointer, source.nbytes, "set_ptr_data", writable=True)
    target[:] = source
