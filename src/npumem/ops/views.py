"""Typed views over raw device bytes, for numpy arrays (host-visible backends) and torch tensors
(the torch backend) alike: what the executor lays over device memory before a kernel runs."""

from __future__ import annotations

import numpy as np

from ..constants import NUMPY_TYPES, DataType
from ..dtypes import numpy_dtype

# torch spells every type as numpy does, and has a real bfloat16.
_TORCH_NAMES = {**NUMPY_TYPES, DataType.BF16: "bfloat16"}


def torch_dtype(dtype):
    """The torch dtype of a DataType or numpy dtype (bf16 is a real bfloat16 in torch)."""
    import torch

    if not isinstance(dtype, DataType):
        dtype = np.dtype(dtype)
        return getattr(torch, "bool" if dtype == np.bool_ else dtype.name)
    return getattr(torch, _TORCH_NAMES[dtype])


def data_type_of_torch(dtype) -> DataType:
    """The DataType of a torch dtype (OpParamError for one npumem has no type for)."""
    name = str(dtype).removeprefix("torch.")
    for data_type, torch_name in _TORCH_NAMES.items():
        if torch_name == name:
            return data_type
    from ..errors import OpParamError
    raise OpParamError(f"torch dtype {dtype} has no npumem data type")


def typed_view(raw, dtype: DataType, shape, strides):
    """`raw` (uint8, starting at the first element) seen as `dtype` with element `strides`."""
    if isinstance(raw, np.ndarray):
        item = numpy_dtype(dtype)
        strides = [s * item.itemsize for s in strides]
        try:         # ~10x cheaper than as_strided; refuses a view that does not fit in raw
            return np.ndarray(shape, item, raw, 0, strides)
        except (TypeError, ValueError):
            return np.lib.stride_tricks.as_strided(raw.view(item), shape, strides)
    return raw.view(torch_dtype(dtype)).as_strided(tuple(shape), tuple(strides))


def region(raw, shape, dtype: np.dtype):
    """The first elements of scratch region `raw` as a contiguous array of `shape` and `dtype`."""
    count = int(np.prod(shape, dtype=np.int64))
    if isinstance(raw, np.ndarray):
        return raw[:count * dtype.itemsize].view(dtype).reshape(shape)
    return raw[:count * dtype.itemsize].view(torch_dtype(dtype)).reshape(tuple(shape))


def copy_into(target, source) -> None:
    """Copy `source` into `target` (same shape), converting the dtype."""
    if isinstance(target, np.ndarray):
        np.copyto(target, source, casting="unsafe")
    else:
        target.copy_(source)
