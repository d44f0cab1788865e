"""AscendCL constants (values from acl_rt.h / acl_base.h), as IntEnums so they print by name."""

from __future__ import annotations

from enum import IntEnum


class MallocPolicy(IntEnum):
    """aclrtMemMallocPolicy: which page kind device memory comes from."""

    HUGE_FIRST = 0
    HUGE_ONLY = 1
    NORMAL_ONLY = 2
    HUGE_FIRST_P2P = 3
    HUGE_ONLY_P2P = 4
    NORMAL_ONLY_P2P = 5
    HUGE1G_ONLY = 6              # 1 GiB pages on a real NPU; huge (2 MiB) pages here
    HUGE1G_ONLY_P2P = 7


# Flags CANN lets a policy carry (ORed in): bandwidth class and read-only mapping. The
# simulated device has one kind of memory, so they are accepted and do not change placement.
MALLOC_POLICY_FLAGS = 0x0100 | 0x1000 | 0x100000


class MemcpyKind(IntEnum):
    """aclrtMemcpyKind: direction of a copy. DEFAULT infers it from the pointers."""

    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3
    DEFAULT = 4
    HOST_TO_BUF_TO_DEVICE = 5     # host -> device, the host bytes staged by the runtime at once
    INNER_DEVICE_TO_DEVICE = 6    # within one device
    INTER_DEVICE_TO_DEVICE = 7    # between two devices


class MemAttr(IntEnum):
    """aclrtMemAttr: which memory `get_mem_info` reports on."""

    DDR_MEM = 0
    HBM_MEM = 1
    DDR_MEM_HUGE = 2
    DDR_MEM_NORMAL = 3
    HBM_MEM_HUGE = 4
    HBM_MEM_NORMAL = 5


class RunMode(IntEnum):
    """aclrtRunMode: whether the program runs on the device's own CPU or on a host."""

    DEVICE = 0
    HOST = 1


class EventStatus(IntEnum):
    """aclrtEventRecordedStatus / aclrtEventStatus as returned by query_event."""

    COMPLETE = 0
    NOT_READY = 1


class DataType(IntEnum):
    """aclDataType (the subset npumem knows)."""

    FLOAT = 0
    FLOAT16 = 1
    INT8 = 2
    INT32 = 3
    UINT8 = 4
    INT16 = 6
    UINT16 = 7
    UINT32 = 8
    INT64 = 9
    UINT64 = 10
    DOUBLE = 11
    BOOL = 12
    BF16 = 27

    # A tensor's dtype compares equal to the names torch and numpy use for it: "float32",
    # np.float32, torch.float32, "bfloat16" (see data_type).
    def __eq__(self, other):
        if isinstance(other, int):
            return int(self) == int(other)
        named = data_type(other)
        return NotImplemented if named is None else int(self) == int(named)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self):
        return int.__hash__(self)


# The names torch and numpy give the types (a torch.dtype prints as "torch.float32").
_ALIASES = {
    "float32": DataType.FLOAT, "float": DataType.FLOAT, "float64": DataType.DOUBLE,
    "double": DataType.DOUBLE, "float16": DataType.FLOAT16, "half": DataType.FLOAT16,
    "bfloat16": DataType.BF16, "bf16": DataType.BF16, "int": DataType.INT32,
    "long": DataType.INT64, "short": DataType.INT16, "bool": DataType.BOOL,
}


def data_type(value) -> "DataType | None":
    """The DataType `value` names: a DataType, its value, its name or torch's and numpy's
    ("float16", "bfloat16", "float32"), a numpy dtype or type, or a torch dtype; None if none."""
    import numpy as np

    if isinstance(value, DataType):
        return value
    if not isinstance(value, (str, int, np.dtype, type)) and str(value).startswith("torch."):
        value = str(value)                                   # a torch.dtype, without torch
    if isinstance(value, str):
        name = value.strip().lower().removeprefix("torch.")
        if name in _ALIASES:
            return _ALIASES[name]
        if name.upper() in DataType.__members__:
            return DataType[name.upper()]
    if isinstance(value, int) and not isinstance(value, bool):
        return DataType(value) if value in DataType._value2member_map_ else None
    try:
        kind = np.dtype(value)
    except TypeError:
        return None
    return next((d for d, n in NUMPY_TYPES.items() if np.dtype(n) == kind and d != DataType.BF16),
                None)


# The numpy type each DataType's elements are (BF16 has none: its tensors hold raw 16-bit words).
NUMPY_TYPES = {
    DataType.FLOAT: "float32", DataType.FLOAT16: "float16", DataType.DOUBLE: "float64",
    DataType.INT8: "int8", DataType.INT16: "int16", DataType.INT32: "int32",
    DataType.INT64: "int64", DataType.UINT8: "uint8", DataType.UINT16: "uint16",
    DataType.UINT32: "uint32", DataType.UINT64: "uint64", DataType.BOOL: "bool",
    DataType.BF16: "uint16",
}


class Format(IntEnum):
    """aclFormat (the subset npumem knows)."""

    NCHW = 0
    NHWC = 1
    ND = 2


# Size rules of the runtime (REFERENCE.md section 2).
MALLOC_ALIGN = 32            # sizes round up to this ...
MALLOC_PADDING = 32          # ... then malloc adds this much
DEVICE_START_ALIGN = 64      # device and pinned host addresses start on this boundary
DVPP_START_ALIGN = 128       # media (DVPP) memory starts on this boundary
ASYNC_COPY_ALIGN = 64        # memcpy_async needs both ends aligned to this
HUGE_PAGE_SIZE = 2 << 20
NORMAL_PAGE_SIZE = 4 << 10
HUGE_FIRST_THRESHOLD = 1 << 20  # HUGE_FIRST serves requests up to 1 MiB from normal pages

HUGE_POLICIES = frozenset({MallocPolicy.HUGE_ONLY, MallocPolicy.HUGE_ONLY_P2P, MallocPolicy.HUGE1G_ONLY,
                           MallocPolicy.HUGE1G_ONLY_P2P})
NORMAL_POLICIES = frozenset({MallocPolicy.NORMAL_ONLY, MallocPolicy.NORMAL_ONLY_P2P})
