"""Tensors on the device: a view (shape, strides, offset, dtype, format) of device storage.

Like aclTensor, a `Tensor` does not own bytes by itself: it points into a `Storage`. Storage made
by `empty`/`zeros`/`from_numpy` comes from the device's caching pool and goes back to it when the
last tensor viewing it is dropped (or at `Storage.free()`); storage given to `create_tensor` stays
the caller's. Views (`t()`, `transpose`, slicing) share storage and never copy.
"""

from __future__ import annotations

import atexit
import math
import operator
import sys
import weakref

import numpy as np

from .. import memory as pool_api
from ..constants import DataType, Format, MemcpyKind
from ..device.sanitizer import SANITIZER, warn
from ..errors import InvalidParamError, MemoryAccessError, OpNullptrError, OpParamError
from ..runtime import memory as rt_memory
from ..runtime.state import RUNTIME
from ..dtypes import as_data_type, itemsize, numpy_dtype
from ..kernel.launch import DeviceTensor
from .dlpack_capsule import dlpack_device, to_dlpack
from .views import typed_view

DATA_ALIGN = 32      # aclCreateTensor: tensor data starts 32-byte aligned


class Storage:
    """Device bytes behind tensors, and the streams whose queued work may still use them."""

    def __init__(self, pointer: int, nbytes: int, device: int, *, pool=None,
                 host_address: int = 0):
        self.pointer, self.nbytes, self.device = pointer, nbytes, device
        self.pool = pool                      # the caching pool it came from (None: not ours)
        self.host_address = host_address      # zero-copy memory: where the host sees the bytes
        self.streams: set = set()             # streams with queued work on these bytes
        # The pool block's sanitizer record (None unless NPUMEM_SANITIZE): tells a stale
        # storage from the allocation that reuses its bytes.
        self.record = SANITIZER.tensor_record(pool, pointer, self.streams) \
            if pool is not None and SANITIZER.on else None
        if pool:                              # its bytes go back to the pool when it dies
            self._finalizer = finalizer = weakref.ref(self, _storage_died)
            _GIVE_BACK[finalizer] = (pool, pointer, self.record)
        else:
            self._finalizer = None

    def used_on(self, stream) -> None:
        """Queued work on `stream` uses these bytes: reuse them only after it."""
        if stream in self.streams:         # told the pool already
            return
        self.streams.add(stream)
        if self.pool is not None and self.pool.owns(self.pointer):
            self.pool.record_stream(self.pointer, stream)

    def wait(self) -> None:
        """Block until every stream that queued work on these bytes has finished it."""
        for stream in list(self.streams):
            if not stream.destroyed:
                stream.synchronize()
        self.streams.clear()

    def free(self) -> None:
        """Give pool memory back now instead of when the last tensor is dropped."""
        if self._finalizer is not None:
            _storage_died(self._finalizer)

    def check_live(self, what: str) -> None:
        """With the pool sanitizer: raise if these bytes were given back (Storage.free()) while
        a tensor still uses them; they may belong to another allocation by now."""
        record = self.record
        if record is not None and not record.live:
            raise MemoryAccessError(
                f"{what}: a stale tensor: its storage, {record.describe()}, was freed "
                "(Storage.free()) while this tensor still used it; its bytes may belong to "
                "another allocation now")


# What weakref.finalize(storage, _give_back, pool, pointer, record) did, for a fraction of its
# cost per storage (a tensor's result makes one per op): a weak reference whose callback gives
# the bytes back, and the arguments under it here; popping them makes the release happen once
# (at the storage's death, at Storage.free(), or at exit, whichever comes first). As with
# weakref.finalize, nothing is given back after the exit handler ran (interpreter teardown).
_GIVE_BACK: dict = {}
_AFTER_EXIT: list = []


def _storage_died(finalizer, pending=_GIVE_BACK, after_exit=_AFTER_EXIT) -> None:
    arguments = pending.pop(finalizer, None)
    if arguments is not None and not after_exit:
        _give_back(*arguments)


@atexit.register
def _give_back_at_exit() -> None:
    """As weakref.finalize does at exit: the storages still alive give their bytes back (the
    oldest first), errors reported as there; later deaths give nothing back."""
    try:
        while _GIVE_BACK:
            finalizer = next(iter(_GIVE_BACK))
            try:
                _storage_died(finalizer)
            except Exception:         # noqa: BLE001 - reported, as weakref.finalize does
                sys.excepthook(*sys.exc_info())
    finally:
        _AFTER_EXIT.append(True)


def _give_back(pool, pointer: int, record) -> None:
    if not pool.owns(pointer):        # released with its device (reset_device, finalize)
        if record is not None:
            SANITIZER.given_back(pool, pointer, record)
        return
    if record is not None:
        if not record.live:           # freed by hand, and the block is another's now
            warn(f"a tensor's storage, {record.describe()}, was already freed by another call "
                 "(caching_allocator_delete?); its own release is skipped, since the bytes "
                 "belong to another allocation now")
            return
        SANITIZER.given_back(pool, pointer, record)
    pool.deallocate_soon(pointer)       # a finalizer must never wait for the pool


def _dims(values, what: str) -> tuple[int, ...]:
    if type(values) is tuple and all(type(v) is int and v >= 0 for v in values):
        return values                 # already checked (a tensor's own shape, say)
    try:
        dims = tuple(operator.index(v) for v in values)
    except TypeError:
        raise OpParamError(f"{what} must be a sequence of integers, got {values!r}") from None
    if any(d < 0 for d in dims):
        raise OpParamError(f"{what} must not be negative, got {dims}")
    return dims


def reach(shape, strides) -> int:
    """Elements from a view's first element to one past the last one it can reach."""
    if any(d == 0 for d in shape):
        return 0
    return sum((d - 1) * s for d, s in zip(shape, strides)) + 1


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


class Tensor:
    """A strided view of device storage. Strides and offset count elements, as in aclCreateTensor.

    Its arithmetic operators (+ - * / @) come from ops/arithmetic.py, which needs the ops."""

    # (release count, array): the kernel's view of the bytes, made by ops/fastpath.py and
    # reused while no device bytes were released since (see that module)
    _kernel_view = None

    def __init__(self, storage: Storage, shape, strides=None, offset: int = 0,
                 dtype=DataType.FLOAT, format: Format = Format.ND, storage_shape=None):
        self.storage = storage
        self.shape = _dims(shape, "shape")
        self.strides = contiguous_strides(self.shape) if strides is None else _dims(strides, "strides")
        if len(self.strides) != len(self.shape):
            raise OpParamError(f"{len(self.shape)}-d shape {self.shape} needs {len(self.shape)} "
                               f"strides, got {self.strides}")
        self.storage_offset = operator.index(offset)
        self.dtype = dtype if type(dtype) is DataType else as_data_type(dtype)
        self.format = format if type(format) is Format else Format(format)
        extent = reach(self.shape, self.strides)
        self.storage_shape = (self.storage_offset + extent,) if storage_shape is None \
            else _dims(storage_shape, "storage shape")
        # Fixed for the view's life (storage never moves): kept for cheap launches.
        size = itemsize(self.dtype)
        self._span = (storage.pointer + self.storage_offset * size, extent * size)
        need = (self.storage_offset + extent) * size
        if self.storage_offset < 0 or need > storage.nbytes:
            raise OpParamError(
                f"a {self.shape} view with strides {self.strides} at offset {self.storage_offset} "
                f"reaches {need} bytes but its storage holds {storage.nbytes}")
        # What a remembered phase 1 is keyed by (ops/phase1_cache.py)
        # (ints, not the enums, whose hash is Python code)
        self._geometry = (self.shape, self.strides, self.storage_offset, int(self.dtype),
                          int(self.format), storage.device)

    # --- geometry -------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None):
        """The shape (a tuple), or the length of dimension `dim`, as torch's size()."""
        if dim is None:
            return self.shape
        try:
            return self.shape[operator.index(dim)]
        except IndexError:
            raise OpParamError(f"size({dim}): a {self.ndim}-d tensor has dims "
                               f"{-self.ndim}..{self.ndim - 1}") from None

    def element_size(self) -> int:
        return self.itemsize

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.numel() * self.itemsize

    @property
    def device(self) -> int:
        return self.storage.device

    def data_ptr(self) -> int:
        """The device address of the first element, as torch's data_ptr() (the storage starts
        at `storage.pointer`, aclCreateTensor's tensorData)."""
        return self.address

    @property
    def address(self) -> int:
        """Device address of the first element."""
        return self._span[0]

    def span(self) -> tuple[int, int]:
        """(device address, bytes) of the storage range this view touches."""
        return self._span

    def is_contiguous(self) -> bool:
        expected = contiguous_strides(self.shape)
        return all(s == e for d, s, e in zip(self.shape, self.strides, expected) if d != 1)

    def _view(self, shape, strides, offset) -> "Tensor":
        return Tensor(self.storage, shape, strides, offset, self.dtype, self.format,
                      self.storage_shape)

    def transpose(self, dim0: int = 0, dim1: int = 1) -> "Tensor":
        """Swap two dimensions: a view, no copy."""
        dims = list(range(self.ndim))
        try:
            dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        except IndexError:
            raise OpParamError(f"transpose({dim0}, {dim1}) of a {self.ndim}-d tensor") from None
        return self.permute(dims)

    def t(self) -> "Tensor":
        if self.ndim > 2:
            raise OpParamError(f"t() takes a tensor of at most 2 dims, got shape {self.shape}; "
                               "use transpose(dim0, dim1)")
        return self.transpose(0, 1) if self.ndim == 2 else self

    @property
    def T(self) -> "Tensor":
        return self.t()

    def permute(self, dims) -> "Tensor":
        dims = [operator.index(d) % max(self.ndim, 1) for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise OpParamError(f"permute{tuple(dims)} is not a permutation of {self.ndim} dims")
        return self._view([self.shape[d] for d in dims], [self.strides[d] for d in dims],
                          self.storage_offset)

    def reshape(self, *shape) -> "Tensor":
        """A view with a new shape (contiguous tensors only; use contiguous() first)."""
        shape = list(shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)
        if shape.count(-1) == 1:
            known = math.prod(d for d in shape if d != -1)
            shape[shape.index(-1)] = self.numel() // known if known else 0
        if math.prod(shape) != self.numel():
            raise OpParamError(f"cannot reshape {self.shape} ({self.numel()} elements) to {tuple(shape)}")
        if not self.is_contiguous():
            raise OpParamError(f"reshape of a non-contiguous {self.shape} view would need a copy; "
                               "call contiguous() first")
        return self._view(shape, None, self.storage_offset)

    def __getitem__(self, index) -> "Tensor":
        """Basic indexing with ints and slices (positive steps): a view, no copy."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > self.ndim:
            raise OpParamError(f"{len(index)} indices for a {self.ndim}-d tensor")
        shape, strides, offset = [], [], self.storage_offset
        for dim, (size, stride) in enumerate(zip(self.shape, self.strides)):
            item = index[dim] if dim < len(index) else slice(None)
            if isinstance(item, slice):
                start, stop, step = item.indices(size)
                if step <= 0:
                    raise OpParamError("negative slice steps are not supported (aclTensor "
                                       "strides are non-negative)")
                shape.append(len(range(start, stop, step)))
                strides.append(stride * step)
                offset += start * stride
            else:
                i = operator.index(item)
                if not -size <= i < size:
                    raise OpParamError(f"index {i} is out of range for dim {dim} of size {size}")
                offset += (i % size) * stride
        return self._view(shape, strides, offset)

    # --- host access ----------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """A host copy of the data, after the queued work on this tensor's storage has run."""
        self.storage.check_live("numpy")
        self.storage.wait()
        address, nbytes = self.span()
        raw = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            rt_memory.memcpy(raw, nbytes, address, nbytes, MemcpyKind.DEVICE_TO_HOST)
        return self._strided(raw).copy()

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """np.asarray(t): the data (a host copy), not an object array."""
        data = self.numpy()
        return data if dtype is None else data.astype(dtype, copy=False)

    def item(self):
        """The one element, as a Python number."""
        if self.numel() != 1:
            raise OpParamError(f"item() needs a tensor of one element, got shape {self.shape} "
                               f"({self.numel()} elements)")
        return self.numpy().item()

    def tolist(self):
        return self.numpy().tolist()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def _strided(self, raw):
        """The view laid over `raw`, a uint8 array (or torch tensor) from the first element."""
        return typed_view(raw, self.dtype, self.shape, self.strides)

    @property
    def __array_interface__(self) -> dict:
        """Host-visible (zero-copy) tensors only: numpy reads the bytes in place."""
        if not self.storage.host_address:
            raise AttributeError("device tensors are not host-visible; use .numpy() to copy")
        host = self.storage.host_address + self.storage_offset * self.itemsize
        return {"version": 3, "shape": self.shape, "typestr": numpy_dtype(self.dtype).str,
                "data": (host, False), "strides": tuple(s * self.itemsize for s in self.strides)}

    def __dlpack__(self, stream=None):
        return to_dlpack(self, stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack_device(self)

    def __repr__(self) -> str:
        layout = "" if self.is_contiguous() else f", strides={self.strides}"
        return (f"npumem.Tensor(shape={self.shape}, dtype={self.dtype.name.lower()}{layout}, "
                f"device={self.device}, address=0x{self.address:x})")


DeviceTensor.register(Tensor)          # what kernels take as a device tensor argument


class Scalar:
    """aclScalar: one value with a data type (alpha of Add, the value of Fill)."""

    def __init__(self, value, dtype=None):
        self.dtype = as_data_type(dtype if dtype is not None else np.asarray(value).dtype)
        self.value = numpy_dtype(self.dtype).type(value)

    def __repr__(self) -> str:
        return f"npumem.Scalar({self.value!r}, {self.dtype.name.lower()})"


def as_scalar(value) -> Scalar:
    return value if isinstance(value, Scalar) else Scalar(value)


# --- constructors ---------------------------------------------------------------------------


def _pool_storage(nbytes: int, device: int | None, stream) -> Storage:
    pool = pool_api.get_allocator(device)            # starts the runtime on first use
    pointer = pool.allocate(nbytes, RUNTIME.stream(stream, "tensor allocation"))
    return Storage(pointer, nbytes, pool.device, pool=pool)


def _size_and_dtype(size: tuple, dtype, what: str):
    """torch's ways to give a size: empty(2, 3), empty((2, 3)), empty([2, 3]); the dtype is a
    keyword. A dtype after a tuple, empty((2, 3), "float16"), is read as one too: it cannot be
    a size. An int after a tuple is ambiguous and refused."""
    if not size:
        raise OpParamError(f"{what}() needs a size: {what}(2, 3) or {what}((2, 3))")
    if isinstance(size[0], (tuple, list)):
        if len(size) == 2 and (isinstance(size[1], DataType) or not isinstance(size[1], int)):
            return _dims(size[0], "size"), size[1]
        if len(size) > 1:
            raise OpParamError(f"{what}{size}: give the size as one tuple or as separate ints, "
                               f"and the dtype as a keyword: {what}({tuple(size[0])}, "
                               "dtype=\"float32\")")
        return _dims(size[0], "size"), dtype
    if any(isinstance(d, DataType) or not isinstance(d, int) for d in size):
        raise OpParamError(f"{what}{size}: sizes are integers; give the dtype as a keyword, "
                           f"{what}(2, 3, dtype=\"float32\")")
    return _dims(size, "size"), dtype


def empty(*size, dtype=DataType.FLOAT, stream=None, device: int | None = None,
          format: Format = Format.ND) -> Tensor:
    """An uninitialised contiguous tensor in pool memory, ordered on `stream` (default: the
    current stream): empty(2, 3) or empty((2, 3)), dtype=... as torch.empty."""
    shape, dtype = _size_and_dtype(size, dtype, "empty")
    dtype = as_data_type(dtype)
    storage = _pool_storage(math.prod(shape) * itemsize(dtype), device, stream)
    return Tensor(storage, shape, None, 0, dtype, format)


def result(shape: tuple[int, ...], dtype: DataType, stream) -> Tensor:
    """`empty(shape, dtype=dtype, stream=stream)` for an op's result, whose shape and dtype come
    from checked tensors: none of empty's argument parsing."""
    storage = _pool_storage(math.prod(shape) * itemsize(dtype), None, stream)
    return Tensor(storage, shape, None, 0, dtype)


def result_template(tensor: Tensor) -> dict:
    """The attributes of `tensor`, made by `result()`, less its storage and span: what
    `fresh_result` makes another result of the same geometry from (ops/fastpath.py)."""
    template = dict(vars(tensor))
    template.pop("_kernel_view", None)
    template["storage"] = template["_span"] = None      # keeps no storage alive
    return template


def fresh_result(storage: Storage, template: dict) -> Tensor:
    """`result(shape, dtype, stream)` with the storage made already and the attributes of a
    result of that shape and dtype from `result_template` (whose `_geometry` names the
    storage's device): none of the checks, the same attributes in the same order
    (tests/test_ops_fastpath.py compares the two)."""
    tensor = Tensor.__new__(Tensor)
    attributes = tensor.__dict__
    attributes.update(template)
    attributes["storage"] = storage
    attributes["_span"] = (storage.pointer, storage.nbytes)
    return tensor


def zeros(*size, dtype=DataType.FLOAT, stream=None, device: int | None = None) -> Tensor:
    """A tensor of zeros; sizes and dtype as `empty`."""
    shape, dtype = _size_and_dtype(size, dtype, "zeros")
    tensor = empty(shape, dtype=dtype, stream=stream, device=device)
    if tensor.nbytes:
        if stream is None:
            rt_memory.memset(tensor.address, tensor.nbytes, 0, tensor.nbytes)
        else:
            rt_memory.memset_async(tensor.address, tensor.nbytes, 0, tensor.nbytes, stream)
            tensor.storage.used_on(RUNTIME.stream(stream, "zeros"))
    return tensor


def from_numpy(array, stream=None, *, device: int | None = None) -> Tensor:
    """A device copy of a host array. With a stream, the copy is staged through the pinned
    host pool and queued on it (the call returns at once)."""
    array = np.require(array, requirements="C")      # ascontiguousarray would make 0-d 1-d
    tensor = empty(array.shape, dtype=as_data_type(array.dtype), stream=stream, device=device)
    nbytes = array.nbytes
    if not nbytes:
        return tensor
    if stream is None:
        rt_memory.memcpy(tensor.address, nbytes, array, nbytes, MemcpyKind.HOST_TO_DEVICE)
        return tensor
    staging_pool = pool_api.host_pool()
    staging = staging_pool.allocate(nbytes)
    rt_memory.memcpy(staging, nbytes, array, nbytes, MemcpyKind.HOST_TO_HOST)
    rt_memory.memcpy_async(tensor.address, nbytes, staging, nbytes, MemcpyKind.HOST_TO_DEVICE, stream)
    staging_pool.free(staging, RUNTIME.stream(stream, "from_numpy"))
    tensor.storage.used_on(RUNTIME.stream(stream, "from_numpy"))
    return tensor


def create_tensor(shape, dtype, strides=None, offset: int = 0, format: Format = Format.ND,
                  data_ptr: int = 0, storage_shape=None) -> Tensor:
    """aclCreateTensor: a view of device memory the caller owns (it is never freed for you).

    `data_ptr` must be a live, 32-byte aligned device pointer holding the storage.
    """
    if not data_ptr:
        raise OpNullptrError("create_tensor: data_ptr is null")
    if data_ptr % DATA_ALIGN:
        raise OpParamError(f"create_tensor: data_ptr 0x{data_ptr:x} must be {DATA_ALIGN}-byte "
                           f"aligned (it is {data_ptr % DATA_ALIGN} bytes past a boundary)")
    dtype = as_data_type(dtype)
    shape = _dims(shape, "shape")
    strides = contiguous_strides(shape) if strides is None else _dims(strides, "strides")
    if storage_shape is None:
        storage_shape = (operator.index(offset) + reach(shape, strides),)
    nbytes = math.prod(_dims(storage_shape, "storage shape")) * itemsize(dtype)
    backend = RUNTIME.require()
    if not backend.is_device_pointer(data_ptr):
        raise InvalidParamError(f"create_tensor: 0x{data_ptr:x} is not a device pointer")
    rng = backend.resolve(data_ptr, nbytes, "create_tensor storage")
    host_address = rng.allocation.host_address + rng.offset \
        if rng.allocation.api == "host_register" else 0
    storage = Storage(data_ptr, nbytes, backend.device_of(data_ptr), host_address=host_address)
    return Tensor(storage, shape, strides, offset, dtype, format, storage_shape)
