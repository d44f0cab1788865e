"""Global and local tensors: views of device memory and of a core's on-chip buffers.

A `GlobalTensor` covers part of one kernel argument; every access is checked against that
argument, so a kernel that reaches outside what it was given faults instead of touching another
allocation. A `LocalTensor` is a typed view of bytes in a core's UB, L1 or L0 buffer, handed out
by a queue or a TBuf; once its queue slot is freed, using it is a fault.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import as_data_type, numpy_dtype
from .context import current


def as_numpy_dtype(dtype) -> np.dtype:
    """A numpy dtype from an npumem DataType, a numpy dtype or their names."""
    try:
        return np.dtype(dtype)
    except TypeError:
        return numpy_dtype(as_data_type(dtype))


class Argument:
    """One tensor argument of a launch: its name and its device bytes."""

    def __init__(self, name: str, address: int, raw: np.ndarray, dtype: np.dtype):
        self.name, self.address, self.raw, self.dtype = name, address, raw, dtype

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes

    def describe(self) -> str:
        return f"argument {self.name} (0x{self.address:x}, {self.nbytes} bytes)"


class GlobalTensor:
    """Elements [offset, offset + size) of a kernel argument, typed `dtype`.

    Kernels get one per tensor argument; `set_global_buffer(arg, size, offset)` or slicing
    (`x[start:stop]`) narrows it, as Ascend C code does with SetGlobalBuffer."""

    def __init__(self, dtype=None, argument: Argument | None = None, offset: int = 0,
                 size: int | None = None):
        self.dtype = as_numpy_dtype(dtype) if dtype is not None else \
            (argument.dtype if argument is not None else None)
        self.argument, self.offset = argument, offset
        if argument is not None and size is None:
            size = argument.nbytes // self.dtype.itemsize - offset
        self.size = size or 0

    def __repr__(self) -> str:
        where = self.argument.name if self.argument else "unset"
        return f"<GlobalTensor {where}[{self.offset}:{self.offset + self.size}] {self.dtype}>"

    def __len__(self) -> int:
        return self.size

    @property
    def address(self) -> int:
        return self.argument.address + self.offset * self.dtype.itemsize

    def set_global_buffer(self, source: "GlobalTensor", size: int | None = None,
                          offset: int = 0) -> "GlobalTensor":
        """Point at `size` elements of `source` (an argument's GlobalTensor) from `offset`."""
        if not isinstance(source, GlobalTensor) or source.argument is None:
            raise current("set_global_buffer").fault(
                f"set_global_buffer needs a kernel argument's GlobalTensor, got "
                f"{type(source).__name__}: global memory outside the kernel's arguments cannot "
                "be reached")
        dtype = self.dtype or source.dtype
        start = source.offset * source.dtype.itemsize // dtype.itemsize + offset
        count = (source.size * source.dtype.itemsize // dtype.itemsize - offset) \
            if size is None else size
        _check_inside(source.argument, start, count, dtype, "set_global_buffer")
        self.dtype, self.argument, self.offset, self.size = dtype, source.argument, start, count
        return self

    def __getitem__(self, index) -> "GlobalTensor":
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise current("GlobalTensor[...]").fault(
                f"{self!r}: index with a slice [start:stop] (use get_value for one element)")
        start = self.offset + (index.start or 0)
        stop = self.offset + (self.size if index.stop is None else index.stop)
        _check_inside(self.argument, start, stop - start, self.dtype, f"{self!r}[{index.start}:"
                      f"{index.stop}]")
        return GlobalTensor(self.dtype, self.argument, start, stop - start)

    def elements(self, start: int, count: int, what: str) -> np.ndarray:
        """The device bytes of elements [start, start + count) of this view, checked."""
        first = self.offset + start
        _check_inside(self.argument, first, count, self.dtype, what)
        size = self.dtype.itemsize
        return self.argument.raw[first * size:(first + count) * size].view(self.dtype)

    def get_value(self, index: int):
        return self.elements(index, 1, f"{self!r}.get_value({index})")[0]

    def set_value(self, index: int, value) -> None:
        self.elements(index, 1, f"{self!r}.set_value({index})")[0] = value


def _check_inside(argument: Argument | None, start: int, count: int, dtype: np.dtype,
                  what: str) -> None:
    context = current(what)
    if argument is None:
        raise context.fault(f"{what}: the GlobalTensor was never pointed at an argument "
                            "(set_global_buffer)")
    first, end = start * dtype.itemsize, (start + count) * dtype.itemsize
    if start < 0 or count < 0 or end > argument.nbytes:
        raise context.fault(
            f"{what}: global access to bytes [{first}, {end}) of {argument.describe()} is "
            f"outside the kernel's arguments (0x{argument.address + first:x}.."
            f"0x{argument.address + end:x}, the argument ends at "
            f"0x{argument.address + argument.nbytes:x})")


class Slot:
    """One buffer of a queue or TBuf: where its bytes are, who holds them, when they are
    ready (written) and free (last read)."""

    def __init__(self, owner, index: int, offset: int, nbytes: int):
        self.owner, self.index, self.offset, self.nbytes = owner, index, offset, nbytes
        self.generation = 0
        self.state = "free"         # free | allocated | queued (TBuf slots: "allocated")
        self.tile = -1
        self.ready = 0.0
        self.last_read = 0.0

    def describe(self) -> str:
        return self.owner.describe(self.index)


class LocalTensor:
    """`size` elements of `dtype` at element `offset` of an on-chip slot."""

    def __init__(self, slot: Slot, dtype: np.dtype, offset: int = 0, size: int | None = None):
        self.slot, self.dtype, self.offset = slot, dtype, offset
        self.generation = slot.generation
        self.size = slot.nbytes // dtype.itemsize - offset if size is None else size
        self.tile = slot.tile if slot.owner.kind == "queue" else None   # TBuf: the core's tile

    def __repr__(self) -> str:
        return (f"<LocalTensor {self.slot.describe()}[{self.offset}:{self.offset + self.size}] "
                f"{self.dtype}>")

    def __len__(self) -> int:
        return self.size

    @property
    def position(self) -> str:
        return self.slot.owner.position

    @property
    def buffer(self) -> str:
        """The physical buffer: UB, L1, L0A, L0B or L0C."""
        return self.slot.owner.physical

    def live(self, what: str) -> "LocalTensor":
        """This tensor, or a use-after-free fault."""
        if self.generation != self.slot.generation or self.slot.state == "free":
            raise current(what).fault(
                f"{what}: use after free_tensor: this tensor's buffer was freed"
                + (" and handed out again" if self.generation != self.slot.generation else ""),
                self.slot.describe(), self.tile)
        return self

    def array(self, what: str, count: int | None = None, start: int = 0) -> np.ndarray:
        """Elements [start, start + count) as a numpy view of the on-chip bytes."""
        self.live(what)
        count = self.size - start if count is None else count
        if start < 0 or count < 0 or start + count > self.size:
            raise current(what).fault(
                f"{what}: {count} element(s) from {start} do not fit this {self.size}-element "
                "local tensor", self.slot.describe(), self.tile)
        owner = self.slot.owner
        raw = owner.memory.buffer(owner.physical)
        first = self.slot.offset + (self.offset + start) * self.dtype.itemsize
        return raw[first:first + count * self.dtype.itemsize].view(self.dtype)

    def __getitem__(self, offset: int) -> "LocalTensor":
        """The tensor from element `offset` on (Ascend C's tensor[offset])."""
        if isinstance(offset, slice):
            start = offset.start or 0
            stop = self.size if offset.stop is None else offset.stop
            return self._sub(start, stop - start)
        return self._sub(offset, self.size - offset)

    def _sub(self, start: int, count: int) -> "LocalTensor":
        self.array("LocalTensor[...]", count, start)          # bounds and liveness
        sub = LocalTensor(self.slot, self.dtype, self.offset + start, count)
        sub.generation, sub.tile = self.generation, self.tile
        return sub

    def reinterpret_cast(self, dtype) -> "LocalTensor":
        """The same bytes seen as another dtype (Ascend C's ReinterpretCast)."""
        dtype = as_numpy_dtype(dtype)
        self.live("reinterpret_cast")
        cast = LocalTensor(self.slot, dtype, self.offset * self.dtype.itemsize // dtype.itemsize,
                           self.size * self.dtype.itemsize // dtype.itemsize)
        cast.generation, cast.tile = self.generation, self.tile
        return cast

    def get_value(self, index: int):
        return self.array(f"get_value({index})", 1, index)[0]

    def set_value(self, index: int, value) -> None:
        self.array(f"set_value({index})", 1, index)[0] = value

    def numpy(self) -> np.ndarray:
        """A copy of the elements (for inspecting a kernel while it runs)."""
        return self.array("numpy").copy()
