"""AscendCL constants under their C names (ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEMCPY_HOST_TO_DEVICE, ...)."""

from ..constants import DataType, EventStatus, Format, MallocPolicy, MemAttr, MemcpyKind, RunMode
from ..errors import *  # noqa: F401,F403 - the ACL_* error codes

for _policy in MallocPolicy:
    globals()[f"ACL_MEM_MALLOC_{_policy.name}"] = int(_policy)
for _kind in MemcpyKind:
    globals()[f"ACL_MEMCPY_{_kind.name}"] = int(_kind)
for _attr in MemAttr:
    globals()[f"ACL_{_attr.name}"] = int(_attr)
for _mode in RunMode:
    globals()[f"ACL_{_mode.name}"] = int(_mode)
for _status in EventStatus:
    globals()[f"ACL_EVENT_STATUS_{_status.name}"] = int(_status)
for _dtype in DataType:
    globals()[f"ACL_{_dtype.name}"] = int(_dtype)
for _format in Format:
    globals()[f"ACL_FORMAT_{_format.name}"] = int(_format)
ACL_DT_UNDEFINED = -1
