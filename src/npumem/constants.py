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
