"""aclDataType <-> numpy dtype. BF16 has no numpy type: its tensors hold raw 16-bit words."""

from __future__ import annotations

import numpy as np

from .constants import NUMPY_TYPES, DataType, data_type
from .errors import OpParamError

def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values as bf16 words: the upper 16 bits, rounded to nearest, ties to even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = 0x7FFF + ((bits >> 16) & 1)
    return ((bits + rounding) >> 16).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bf16 words as float32 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


_NUMPY = {d: np.dtype(name) for d, name in NUMPY_TYPES.items()}
_ITEMSIZE = {d: t.itemsize for d, t in _NUMPY.items()}


def numpy_dtype(dtype: DataType) -> np.dtype:
    return _NUMPY[dtype]


def itemsize(dtype: DataType) -> int:
    return _ITEMSIZE[dtype]


def as_data_type(dtype) -> DataType:
    """The DataType `dtype` names (see constants.data_type), or OpParamError listing them."""
    named = data_type(dtype)
    if named is None:
        known = ", ".join(d.name.lower() for d in DataType)
        raise OpParamError(f"unknown data type {dtype!r}; npumem knows {known} (and torch's and "
                           "numpy's names: float32, float64, bfloat16, half, ...)")
    return named


def computable(dtype: DataType, op: str) -> np.dtype:
    """The numpy dtype kernels compute in; BF16 is storage only."""
    if dtype == DataType.BF16:
        raise OpParamError(f"{op}: bf16 tensors can be stored and copied but not computed on; "
                           "cast them to float32 (on the host) first")
    return numpy_dtype(dtype)
