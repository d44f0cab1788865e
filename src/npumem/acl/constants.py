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
