"""A pyACL-compatible module: `import npumem.acl as acl`.

Same names, arguments and return conventions as the official binding (REFERENCE.md section 1):
each call returns an int code, or a tuple whose last item is the code; 0 means success. The error
behind a non-zero code is logged and available from `acl.get_recent_err_msg()`.
"""

from __future__ import annotations

from .. import runtime as _rt
from ..errors import InvalidHandleError, InvalidParamError
from ..runtime.handles import lookup, new_handle
from . import constants, media, rt, util
from ._result import code_of, recent_error_message, set_result_order, values_and_code
from .constants import *  # noqa: F401,F403


def init(config_path: str = ""):
    return code_of(_rt.init, config_path or "")


def finalize():
    return code_of(_rt.finalize)


def get_recent_err_msg() -> str:
    """The message of the last failed call on this thread."""
    return recent_error_message()


class _DataBuffer:
    """aclDataBuffer: a (pointer, size) pair describing memory for model or operator I/O."""

    def __init__(self, data: int, size: int):
        self.handle = new_handle(self)
        self.destroyed = False
        self.update(data, size)

    def update(self, data: int, size: int) -> None:
        if not isinstance(data, int) or not isinstance(size, int) or size < 0 or (data == 0 and size):
            raise InvalidParamError(f"data buffer needs a pointer and a size >= 0, got {data!r}, {size!r}")
        self.data, self.size = data, size

    def check_alive(self) -> None:
        if self.destroyed:
            raise InvalidHandleError(f"data buffer 0x{self.handle:x} was destroyed")


_buffers: dict[int, _DataBuffer] = {}   # keeps buffers alive until destroy_data_buffer


def create_data_buffer(data: int, size: int) -> int:
    """A data buffer handle for `size` bytes at `data` (0 on bad arguments, as pyACL)."""
    try:
        buffer = _DataBuffer(data, size)
    except InvalidParamError as exc:
        from ._result import _failed
        _failed(exc)
        return 0
    _buffers[buffer.handle] = buffer
    return buffer.handle


def _buffer(handle) -> _DataBuffer:
    return lookup(handle, _DataBuffer, "data buffer")


def get_data_buffer_addr(data_buffer: int) -> int:
    return _buffer(data_buffer).data if data_buffer in _buffers else 0


def get_data_buffer_size_v2(data_buffer: int) -> int:
    return _buffer(data_buffer).size if data_buffer in _buffers else 0


get_data_buffer_size = get_data_buffer_size_v2


def update_data_buffer(data_buffer: int, data: int, size: int) -> int:
    return code_of(lambda: _buffer(data_buffer).update(data, size))


def destroy_data_buffer(data_buffer: int) -> int:
    def destroy():
        _buffer(data_buffer).destroyed = True
        _buffers.pop(data_buffer, None)
    return code_of(destroy)


__all__ = [
    "init", "finalize", "get_recent_err_msg", "create_data_buffer", "get_data_buffer_addr",
    "get_data_buffer_size", "get_data_buffer_size_v2", "update_data_buffer",
    "destroy_data_buffer", "set_result_order", "rt", "util", "media", "constants",
]
