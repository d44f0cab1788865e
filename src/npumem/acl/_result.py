"""pyACL's return convention: an int code, or a tuple with the code last.

npumem's runtime raises; this module turns an `AclError` into its code, remembers the message for
`acl.get_recent_err_msg()` and logs it (pyACL writes its errors to the log too).

Some published code (the seed article's test framework among it) unpacks results the other way
round, `ret, value = ...`. Set NPUMEM_ACL_RET_FIRST=1 or call `acl.set_result_order("ret_first")`
to run such code unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from ..errors import (
    ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_RT_THREAD_SUBSCRIBE, ACL_SUCCESS, AclError,
    InvalidParamError,
)

log = logging.getLogger("npumem.acl")
_last_error = threading.local()
_ret_first = os.environ.get("NPUMEM_ACL_RET_FIRST", "").strip().lower() in ("1", "true", "yes")


def set_result_order(order: str) -> None:
    """'ret_last' (pyACL's own convention, the default) or 'ret_first'."""
    global _ret_first
    if order not in ("ret_last", "ret_first"):
        raise ValueError(f"result order must be 'ret_last' or 'ret_first', got {order!r}")
    _ret_first = order == "ret_first"


def recent_error_message() -> str:
    return getattr(_last_error, "message", "")


# Codes a callback thread's process_report loop gets all the time: CANN logs them at INFO.
_ROUTINE = {ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_RT_THREAD_SUBSCRIBE}


def report_failure(exc: AclError) -> int:
    """Remember and log a failed call's message and code (the thread's last error, for
    get_last_error / peek_at_last_error); returns its code."""
    _last_error.message = str(exc)
    _last_error.code = exc.code
    log.log(logging.DEBUG if exc.code in _ROUTINE else logging.WARNING, "%s", exc)
    return exc.code


def last_error_code(clear: bool) -> int:
    """This thread's last error code (0 when none since the last clear)."""
    code = getattr(_last_error, "code", ACL_SUCCESS)
    if clear:
        _last_error.code = ACL_SUCCESS
    return code


# What a wrong-typed argument makes Python raise somewhere below a call (comparing a string
# with a number, hashing a list, indexing with a float, ...). A pyACL call never raises: these
# become ACL_ERROR_INVALID_PARAM with the Python error in the message.
WRONG_ARGUMENT = (TypeError, ValueError, OverflowError, AttributeError, KeyError, IndexError)


def as_acl_error(exc: Exception, depth: int = 2) -> AclError:
    """`exc` as an AclError; a Python error names the acl call (the caller `depth` frames up)."""
    if isinstance(exc, AclError):
        return exc
    name = sys._getframe(depth).f_code.co_name
    return InvalidParamError(f"{name}: invalid argument ({type(exc).__name__}: {exc})")


def code_of(function, *args) -> int:
    """Call `function`; return 0 on success, the ACL code on failure."""
    try:
        function(*args)
    except (AclError, *WRONG_ARGUMENT) as exc:
        return report_failure(as_acl_error(exc))
    return ACL_SUCCESS


def values_and_code(function, *args, failed=(0,)) -> tuple:
    """Call `function`; return its value(s) then the code (or code first, see module doc)."""
    try:
        values = function(*args)
        values = values if isinstance(values, tuple) else (values,)
        ret = ACL_SUCCESS
    except (AclError, *WRONG_ARGUMENT) as exc:
        values, ret = failed, report_failure(as_acl_error(exc))
    return (ret, *values) if _ret_first else (*values, ret)
