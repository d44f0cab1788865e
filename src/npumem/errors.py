"""ACL error codes and the exceptions that carry them.

Every exception npumem raises for a runtime failure is an `AclError` with `.code` set to the
AscendCL return code (REFERENCE.md section 1), so the `npumem.acl` shim can turn it back into the
integer a pyACL program expects. Subclasses also derive from the matching built-in exception
(`ValueError`, `MemoryError`, ...) so ordinary Python code can catch them naturally.
"""

from __future__ import annotations

import operator

ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_INVALID_FILE = 100003
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_API_NOT_SUPPORT = 200001
ACL_ERROR_INVALID_DEVICE = 200002
ACL_ERROR_MEMORY_ADDRESS_UNALIGNED = 200003
ACL_ERROR_INTERNAL_ERROR = 500000
ACL_ERROR_FAILURE = 500001
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_ADDR_UNALIGNED = 107008
ACL_ERROR_RT_INVALID_MEMORY_TYPE = 107016
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_MEMORY_FREE = 207002
ACL_ERROR_RT_NO_DEVICE = 207004
ACL_ERROR_RT_INTERNAL_ERROR = 507000
ACL_ERROR_RT_STREAM_NOT_COMPLETE = 507004
ACL_ERROR_REPEAT_SUBSCRIBE = 100033
ACL_ERROR_STREAM_NOT_SUBSCRIBE = 100034
ACL_ERROR_RT_THREAD_SUBSCRIBE = 107012
ACL_ERROR_RT_STREAM_NO_CB_REG = 107015
ACL_ERROR_RT_REPORT_TIMEOUT = 507012
ACL_ERROR_RT_AICORE_EXCEPTION = 507015
ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID = 107006
ACL_ERROR_RT_EVENT_NOT_COMPLETE = 507006
ACL_ERROR_RT_CONTEXT_RELEASE_ERROR = 507007
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047
ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 507910
ACL_ERROR_HOST_MEMORY_NOT_REGISTERED = 507911
ACLNN_ERR_PARAM_NULLPTR = 161001
ACLNN_ERR_PARAM_INVALID = 161002
ACLNN_ERR_INNER_NULLPTR = 561103

ERROR_NAMES = {
    value: name for name, value in globals().items()
    if name.startswith(("ACL_", "ACLNN_")) and isinstance(value, int)
}


def error_name(code: int) -> str:
    """'ACL_ERROR_RT_MEMORY_FREE' for 207002; 'unknown error' for codes npumem does not know."""
    return ERROR_NAMES.get(code, "unknown error")


class AclError(RuntimeError):
    """A failed runtime call. `.code` is the ACL return code, `str()` says what and why."""

    default_code = ACL_ERROR_FAILURE

    def __init__(self, message: str, code: int | None = None):
        self.code = self.default_code if code is None else code
        self.message = message
        super().__init__(f"{message} [{error_name(self.code)} {self.code}]")

    def __reduce__(self):       # rebuilt from its parts across processes (not code twice)
        return type(self), (self.message, self.code), self.__dict__


class InvalidParamError(AclError, ValueError):
    """An argument is out of range: a bad size, policy, copy kind, or count above its maximum."""

    default_code = ACL_ERROR_INVALID_PARAM


class UninitializedError(AclError):
    """A call that needs `init()` came before it, or after `finalize()`."""

    default_code = ACL_ERROR_UNINITIALIZE


class RepeatInitializeError(AclError):
    default_code = ACL_ERROR_REPEAT_INITIALIZE


class RepeatFinalizeError(AclError):
    default_code = ACL_ERROR_REPEAT_FINALIZE


class InvalidDeviceError(AclError, ValueError):
    default_code = ACL_ERROR_RT_INVALID_DEVICEID


class ContextNullError(AclError):
    """No device or context is current on this thread."""

    default_code = ACL_ERROR_RT_CONTEXT_NULL


class InvalidHandleError(AclError, ValueError):
    """A stream, event or context handle that was destroyed or never existed."""

    default_code = ACL_ERROR_RT_PARAM_INVALID


class MemoryAccessError(AclError):
    """A copy or fill touches bytes outside a live allocation (out of bounds, use after free)."""

    default_code = ACL_ERROR_RT_PARAM_INVALID


class AddressUnalignedError(AclError, ValueError):
    default_code = ACL_ERROR_RT_ADDR_UNALIGNED


class InvalidMemoryTypeError(AclError, ValueError):
    """Memory of the wrong kind: pageable host memory for an async copy, host memory to `free`."""

    default_code = ACL_ERROR_RT_INVALID_MEMORY_TYPE


class FeatureNotSupportedError(AclError):
    default_code = ACL_ERROR_RT_FEATURE_NOT_SUPPORT


class MemoryAllocationError(AclError, MemoryError):
    """The device (or its huge or normal pages) cannot hold the request."""

    default_code = ACL_ERROR_RT_MEMORY_ALLOCATION


class MemoryFreeError(AclError):
    """Double free, or freeing a pointer this allocator never handed out."""

    default_code = ACL_ERROR_RT_MEMORY_FREE


class StreamNotCompleteError(AclError):
    default_code = ACL_ERROR_RT_STREAM_NOT_COMPLETE


class StreamDeadlockError(AclError):
    """A record or wait that would make streams wait on each other in a cycle; nothing was queued."""

    default_code = ACL_ERROR_RT_PARAM_INVALID


class AsyncTaskError(AclError):
    """Work queued on a stream failed while running; raised at the next synchronize."""

    default_code = ACL_ERROR_RT_INTERNAL_ERROR


class KernelFault(AclError):
    """A kernel failed on an AI core: the sanitizer caught a bad access or the kernel's code
    raised. Like a device fault, it stops the kernel's stream until synchronize reports it."""

    default_code = ACL_ERROR_RT_AICORE_EXCEPTION


class OpNullptrError(AclError, ValueError):
    """An aclnn call got no tensor, workspace or output where one is required."""

    default_code = ACLNN_ERR_PARAM_NULLPTR


class OpParamError(AclError, ValueError):
    """An aclnn argument is wrong: shapes, dtypes, a too-small workspace."""

    default_code = ACLNN_ERR_PARAM_INVALID


class ExecutorError(AclError, ValueError):
    """The executor was already run (and is single-use), destroyed, or never existed."""

    default_code = ACLNN_ERR_INNER_NULLPTR


class ContextReleaseError(AclError):
    """reset_device / destroy_context released everything, but work still queued on one of
    its streams failed (a wait for an event never recorded, an async error never synchronized):
    CANN's code for a context that could not be released cleanly."""

    default_code = ACL_ERROR_RT_CONTEXT_RELEASE_ERROR


class HostRegisterError(AclError):
    """host_register of a range already registered (507910), or host_unregister of memory that
    is not (507911)."""


class OutOfScopeError(AclError, NotImplementedError):
    """A pyACL area npumem does not implement (acl.op, acl.mdl, acl.prof): not an
    AttributeError, so `hasattr` and `getattr(..., default)` cannot hide that it is missing."""

    default_code = ACL_ERROR_API_NOT_SUPPORT


class LiveAllocationsWarning(RuntimeWarning):
    """Device or pinned host memory was still allocated at reset_device / finalize (shown by
    default: a ResourceWarning would be hidden, and this is usually a leak)."""


class StrictWarning(UserWarning):
    """NPUMEM_STRICT=1: a call AscendCL accepts but that is probably a mistake (a memcpy kind
    that does not match the two addresses, an unknown malloc policy)."""


def user_stacklevel() -> int:
    """The `stacklevel` that makes warnings.warn name the user's line: the first frame outside
    npumem above the function that warns. A fixed level cannot: the same warning is reached
    through the runtime, the pyACL shim, the memory API or a context manager, each at another
    depth. Where every frame is npumem's (the CLI), the outermost one."""
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1          # 1: the function that calls warnings.warn
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def strict(message: str) -> None:
    """Warn about `message` under NPUMEM_STRICT=1; otherwise say nothing, as CANN does."""
    import os
    import warnings

    if os.environ.get("NPUMEM_STRICT", "") not in ("", "0"):
        warnings.warn(message, StrictWarning, stacklevel=user_stacklevel())


def integer_argument(value, what: str) -> int:
    """`value` as an int: anything with __index__ (numpy integers too); a bool, float, string
    or None is an InvalidParamError naming `what`."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise InvalidParamError(f"{what} must be an integer, got {type(value).__name__} {value!r}")


class CommandError(Exception):
    """An `npumem` command cannot go on: `message` is the line the user reads (without
    "error: "), `exit_code` the status the command ends with (2: bad input, the default). Verbs
    raise it; the command group (npumem.cli) prints it and exits, in that one place. Here, on
    the ground floor, so that a verb outside the cli package (estimate) raises it too."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message
