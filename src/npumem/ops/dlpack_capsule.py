"""DLPack's ABI (the "dltensor" capsule protocol, written with ctypes) and the export side.

Export: a tensor goes out at the real address of its bytes when the consumer can read them in
place: zero-copy tensors (host memory mapped into the device) and every tensor on torch:cpu as
CPU tensors, tensors on torch:cuda as CUDA tensors. Simulated device memory reports kDLExtDev from
`__dlpack_device__` and refuses `__dlpack__` with a BufferError: no consumer could read it (and a
refused capsule would reach its destructor with the consumer's exception pending).

Tensors use this module for `__dlpack__`; the import side (`dlpack.from_dlpack`) builds tensors,
so it lives apart and the two modules do not import each other.
"""

from __future__ import annotations

import ctypes
import itertools
import threading

from ..constants import DataType
from ..device.backend import DLPACK_CPU, DLPACK_EXT_DEV
from ..runtime.state import RUNTIME

_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_CODES = {
    DataType.INT8: (_INT, 8), DataType.INT16: (_INT, 16), DataType.INT32: (_INT, 32),
    DataType.INT64: (_INT, 64), DataType.UINT8: (_UINT, 8), DataType.UINT16: (_UINT, 16),
    DataType.UINT32: (_UINT, 32), DataType.UINT64: (_UINT, 64), DataType.FLOAT16: (_FLOAT, 16),
    DataType.FLOAT: (_FLOAT, 32), DataType.DOUBLE: (_FLOAT, 64), DataType.BF16: (_BFLOAT, 16),
    DataType.BOOL: (_BOOL, 8),
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}
_DTYPES[(_UINT, 1)] = DataType.BOOL          # older producers


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", _DELETER)]

_api = ctypes.pythonapi
# The destructor gets the dying capsule as a raw address and reads its fields (PyObject header,
# then pointer and name): wrapping it in a py_object would resurrect an object being deallocated.
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_HEADER = object.__basicsize__
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Exported tensors stay alive here until the consumer calls the deleter.
_exported: dict[int, tuple] = {}
_keys = itertools.count(1)
_lock = threading.Lock()


@_DELETER
def _delete(managed) -> None:
    with _lock:
        _exported.pop(managed.contents.manager_ctx or 0, None)


@_CAPSULE_DESTRUCTOR
def _capsule_gone(capsule) -> None:
    pointer = ctypes.c_void_p.from_address(capsule + _HEADER).value
    name = ctypes.c_char_p.from_address(capsule + _HEADER + ctypes.sizeof(ctypes.c_void_p)).value
    if name == b"dltensor" and pointer:          # never consumed: drop our reference
        _delete(ctypes.cast(pointer, ctypes.POINTER(_Managed)))


def dlpack_device(tensor) -> tuple[int, int]:
    """(DLPack device type, id) of an npumem tensor's bytes."""
    if tensor.storage.host_address:
        return DLPACK_CPU, 0
    return RUNTIME.require().dlpack_device(tensor.device)


def to_dlpack(tensor, stream=None):
    """A "dltensor" capsule viewing a tensor's bytes in place, after its queued work."""
    device_type, device_id = dlpack_device(tensor)
    if device_type == DLPACK_EXT_DEV:
        raise BufferError(f"{tensor!r} is in device memory, which the host cannot read in "
                          "place; copy it with .numpy(), or build it on zero-copy memory")
    tensor.storage.wait()         # on cuda the streams' work is finished on the device, too
    base = tensor.storage.host_address or RUNTIME.backend.native_pointer(tensor.storage.pointer)
    shape = (ctypes.c_int64 * max(tensor.ndim, 1))(*tensor.shape)
    strides = (ctypes.c_int64 * max(tensor.ndim, 1))(*tensor.strides)
    code, bits = _CODES[tensor.dtype]
    managed = _Managed()
    managed.dl_tensor = _DLTensor(base, _Device(device_type, device_id), tensor.ndim,
                                  _DataType(code, bits, 1), shape, strides,
                                  tensor.storage_offset * tensor.itemsize)
    key = next(_keys)
    managed.manager_ctx = key
    managed.deleter = _delete
    with _lock:
        _exported[key] = (tensor, managed, shape, strides)
    return _api.PyCapsule_New(ctypes.addressof(managed), b"dltensor", _capsule_gone)
