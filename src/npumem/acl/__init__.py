"""A pyACL-compatible module: `import npumem.acl as acl`.

Same names, arguments and return conventions as the official binding (REFERENCE.md section 1):
each call returns an int code, or a tuple whose last item is the code; 0 means success. The error
behind a non-zero code is logged and available from `acl.get_recent_err_msg()`.
"""

from __future__ import annotations

import logging
import types

from .. import runtime as _rt
from ..errors import InvalidHandleError, InvalidParamError, OutOfScopeError
from ..runtime.handles import forget, new_handle
from . import constants, media, rt, util
from ._result import code_of, recent_error_message, report_failure, set_result_order, values_and_code
from .constants import *  # noqa: F401,F403


def init(config_path: str = ""):
    return code_of(_rt.init, config_path or "")


def finalize():
    return code_of(_rt.finalize)


# acl.app_log levels
ACL_DEBUG, ACL_INFO, ACL_WARNING, ACL_ERROR = 0, 1, 2, 3
_APP_LOG_LEVELS = {ACL_DEBUG: logging.DEBUG, ACL_INFO: logging.INFO, ACL_WARNING: logging.WARNING,
                   ACL_ERROR: logging.ERROR}
app_logger = logging.getLogger("npumem.acl.app")


def app_log(log_level: int, message: str) -> None:
    """ACL_APP_LOG: `message` into the application log (Python logging, "npumem.acl.app");
    an unknown level (or one of a wrong type) logs at ERROR, as nothing may be lost."""
    level = _APP_LOG_LEVELS.get(log_level, logging.ERROR) if isinstance(log_level, int) \
        else logging.ERROR
    app_logger.log(level, "%s", message)


# The acl_rt.h version whose calls npumem's list was checked against (aclrtGetVersion).
ACL_MAJOR_VERSION, ACL_MINOR_VERSION, ACL_PATCH_VERSION = 1, 17, 0


def get_version():
    """(major, minor, patch, ret): the AscendCL API version npumem follows; works before init."""
    return values_and_code(lambda: (ACL_MAJOR_VERSION, ACL_MINOR_VERSION, ACL_PATCH_VERSION),
                           failed=(0, 0, 0))


def get_soc_name() -> str:
    """The chip's name, as aclrtGetSocName gives it (works before init): NPUMEM_SOC_NAME, the
    NPU's name on torch:npu, else Ascend910B3, the chip the simulated NPU models."""
    import os

    name = os.environ.get("NPUMEM_SOC_NAME", "").strip()
    if name:
        return name
    backend = _rt.RUNTIME.backend
    if backend is not None and backend.name == "torch:npu":
        import torch
        return torch.npu.get_device_name(0)
    return "Ascend910B3"


def get_recent_err_msg() -> str:
    """The message of the last failed call on this thread."""
    return recent_error_message()


class _DataBuffer:
    """aclDataBuffer: a (pointer, size) pair describing memory for model or operator I/O."""

    def __init__(self, data: int, size: int):
        self.handle = new_handle(self)
        self.update(data, size)

    def update(self, data: int, size: int) -> None:
        if not isinstance(data, int) or not isinstance(size, int) or size < 0 or (data == 0 and size):
            raise InvalidParamError(f"data buffer needs a pointer and a size >= 0, got {data!r}, {size!r}")
        self.data, self.size = data, size


_buffers: dict[int, _DataBuffer] = {}   # live data buffers by handle, until destroy_data_buffer


def _buffer(handle) -> _DataBuffer:
    buffer = _find_buffer(handle)
    if buffer is None:
        raise InvalidHandleError(f"0x{handle:x} is not a live data buffer" if isinstance(handle, int)
                                 else f"{handle!r} is not a data buffer handle")
    return buffer


def create_data_buffer(data: int, size: int) -> int:
    """A data buffer handle for `size` bytes at `data`; 0 on bad arguments, as pyACL."""
    try:
        buffer = _DataBuffer(data, size)
    except InvalidParamError as exc:
        report_failure(exc)
        return 0
    _buffers[buffer.handle] = buffer
    return buffer.handle


def _find_buffer(handle) -> _DataBuffer | None:
    """The live buffer for `handle`, None for anything else (an unhashable one included)."""
    return _buffers.get(handle) if isinstance(handle, int) else None


def get_data_buffer_addr(data_buffer: int) -> int:
    buffer = _find_buffer(data_buffer)
    return buffer.data if buffer else 0


def get_data_buffer_size_v2(data_buffer: int) -> int:
    buffer = _find_buffer(data_buffer)
    return buffer.size if buffer else 0


get_data_buffer_size = get_data_buffer_size_v2


def update_data_buffer(data_buffer: int, data: int, size: int) -> int:
    return code_of(lambda: _buffer(data_buffer).update(data, size))


def destroy_data_buffer(data_buffer: int) -> int:
    def destroy():
        handle = _buffer(data_buffer).handle
        del _buffers[handle]
        forget(handle)
    return code_of(destroy)


class _OutOfScope(types.ModuleType):
    """A pyACL area npumem leaves out: any name under it raises OutOfScopeError saying what to
    use instead. Dunder names stay AttributeErrors so that import, pickle and inspect work."""

    def __init__(self, name: str, what: str, instead: str):
        super().__init__(name, f"Not part of npumem: {what}. {instead}")
        self._what, self._instead = what, instead

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise OutOfScopeError(f"{self.__name__}.{attr}: {self._what} is not part of npumem's "
                              f"memory scope. {self._instead}")

    def __dir__(self):
        return ["__doc__", "__name__"]


op = _OutOfScope(
    "acl.op", "single-operator compilation and execution (acl.op)",
    "Run operators with npumem.ops instead: the aclnn two-phase API (phase 1 sizes the "
    "workspace, phase 2 runs on a stream), with its memory planned and checked by npumem")
mdl = _OutOfScope(
    "acl.mdl", "model loading and execution (acl.mdl)",
    "npumem offers nothing in its place: run models with CANN itself; `npumem profile` and "
    "`npumem report` can still show their memory")
prof = _OutOfScope(
    "acl.prof", "profiling through msprof (acl.prof)",
    "Use `npumem profile` for memory timelines, and `npumem report` on msprof / torch_npu "
    "profiler output (PROF_*, *_ascend_pt folders) for msprof-style analysis")
_OUT_OF_SCOPE = ("op", "mdl", "prof")


def install_as_acl(force: bool = False) -> None:
    """Make `import acl` (and `acl.rt`, `acl.util`, `acl.media`) load this module.

    For running pyACL programs unchanged. A real pyACL already importable wins unless `force`.
    """
    import importlib.util
    import sys

    if not force and "acl" not in sys.modules and importlib.util.find_spec("acl") is not None:
        return
    module = sys.modules[__name__]
    sys.modules["acl"] = module
    for name in ("rt", "util", "media", "constants", *_OUT_OF_SCOPE):
        sys.modules[f"acl.{name}"] = getattr(module, name)
