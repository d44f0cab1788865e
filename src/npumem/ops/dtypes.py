"""aclDataType <-> numpy dtype. BF16 has no numpy type: its tensors hold raw 16-bit words."""

from __future__ import annotations

import numpy as np

from ..constants import DataType
from ..errors import OpParamError

_NUMPY = {
    DataType.FLOAT: np.float32, DataType.FLOAT16: np.float16, DataType.DOUBLE: np.float64,
    DataType.INT8: np.int8, DataType.INT16: np.int16, DataType.INT32: np.int32,
    DataType.INT64: np.int64, DataType.UINT8: np.uint8, DataType.UINT16: np.uint16,
    DataType.UINT32: np.uint32, DataType.UINT64: np.uint64, DataType.BOOL: np.bool_,
    DataType.BF16: np.uint16,
}
_ACL = {np.dtype(t): d for d, t in _NUMPY.items() if d != DataType.BF16}


def numpy_dtype(dtype: DataType) -> np.dtype:
    return np.dtype(_NUMPY[dtype])


def itemsize(dtype: DataType) -> int:
    return numpy_dtype(dtype).itemsize


def as_data_type(dtype) -> DataType:
    """A DataType from a DataType, its int value or name ("float16"), or a numpy dtype."""
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, str) and dtype.upper() in DataType.__members__:
        return DataType[dtype.upper()]
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        try:
            return DataType(dtype)
        except ValueError:
            pass
    else:
        try:
            return _ACL[np.dtype(dtype)]
        except (TypeError, KeyError):
            pass
    known = ", ".join(d.name.lower() for d in DataType)
    raise OpParamError(f"unknown data type {dtype!r}; npumem knows {known}")


def computable(dtype: DataType, op: str) -> np.dtype:
    """The numpy dtype kernels compute in; BF16 is storage only."""
    if dtype == DataType.BF16:
        raise OpParamError(f"{op}: bf16 tensors can be stored and copied but not computed on; "
                           "cast them to float32 (on the host) first")
    return numpy_dtype(dtype)
