"""AscendCL constants under their C names (ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEMCPY_HOST_TO_DEVICE, ...)."""

from ..constants import DataType, EventStatus, Format, MallocPolicy, MemAttr, MemcpyKind, RunMode
from ..errors import *  # noqa: F401,F403 - the ACL_* error codes

_PREFIXES = {
    MallocPolicy: "ACL_MEM_MALLOC_", MemcpyKind: "ACL_MEMCPY_", MemAttr: "ACL_", RunMode: "ACL_",
    EventStatus: "ACL_EVENT_STATUS_", DataType: "ACL_", Format: "ACL_FORMAT_",
}
for _enum, _prefix in _PREFIXES.items():
    globals().update({_prefix + member.name: int(member) for member in _enum})
ACL_DT_UNDEFINED = -1

# Values from acl_rt.h for the calls added with create_stream_with_config and its neighbours.
ACL_RT_THREAD_LEVEL = 0
ACL_HOST_REGISTER_MAPPED, ACL_HOST_REGISTER_IOMEMORY, ACL_HOST_REGISTER_READONLY = 0, 0x4, 0x8
ACL_RT_MEM_ATTR_RSV, ACL_RT_MEM_ATTR_MODULE_ID = 0, 1
ACL_RT_MEM_ATTR_DEVICE_ID, ACL_RT_MEM_ATTR_VA_FLAG = 2, 3
ACL_STREAM_FAST_LAUNCH, ACL_STREAM_FAST_SYNC, ACL_STREAM_PERSISTENT = 0x1, 0x2, 0x4
ACL_STREAM_HUGE, ACL_STREAM_CPU_SCHEDULE, ACL_STREAM_DEVICE_USE_ONLY = 0x8, 0x10, 0x20
ACL_STREAM_STATUS_COMPLETE, ACL_STREAM_STATUS_NOT_READY = 0, 1
ACL_EVENT_SYNC, ACL_EVENT_CAPTURE_STREAM_PROGRESS, ACL_EVENT_TIME_LINE = 0x1, 0x2, 0x8
ACL_EVENT_DEVICE_USE_ONLY, ACL_EVENT_EXTERNAL, ACL_EVENT_IPC = 0x10, 0x20, 0x40
ACL_EVENT_RECORDED_STATUS_NOT_READY, ACL_EVENT_RECORDED_STATUS_COMPLETE = 0, 1
ACL_EVENT_WAIT_STATUS_COMPLETE, ACL_EVENT_WAIT_STATUS_NOT_READY = 0, 1
