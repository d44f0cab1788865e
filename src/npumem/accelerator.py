"""The device API as torch.cuda / torch.npu spell it, for people who come from PyTorch.

    npumem.is_available(), npumem.device_count()
    s = npumem.Stream()
    with npumem.stream(s):           # work given no stream goes to s
        y = x + x
    npumem.current_stream().synchronize(); npumem.synchronize()
    start, end = npumem.Event(enable_timing=True), npumem.Event(enable_timing=True)

Like torch.cuda, these start the runtime and device 0 on first use. The AscendCL-style calls
(`npumem.malloc`, `npumem.create_stream`, ...) keep AscendCL's rule: init and set_device first.
"""

from __future__ import annotations

import contextlib

from .runtime.state import RUNTIME
from .runtime.stream import Stream


def is_available() -> bool:
    """Whether a device can be used: the configured backend can start (the simulated NPU
    always can)."""
    if RUNTIME.initialized:
        return RUNTIME.backend.device_count > 0
    from .device.select import default_spec, device_count_of
    from .errors import AclError

    try:
        return device_count_of(RUNTIME.next_backend or default_spec()) > 0
    except AclError:
        return False


def device_count() -> int:
    """How many devices the backend drives (before init: the ones init would drive)."""
    from .runtime.control import get_device_count
    return get_device_count()


def current_device() -> int:
    return RUNTIME.lazy_context().device


def current_stream(device: int | None = None) -> Stream:
    """The stream work goes to when none is given (`with npumem.stream(s)` changes it)."""
    context = RUNTIME.lazy_context()
    if device is not None and RUNTIME.check_device(device) != context.device:
        return RUNTIME.context_for_new_stream(device).default_stream
    return RUNTIME.current_stream()


def default_stream(device: int | None = None) -> Stream:
    return RUNTIME.context_for_new_stream(device).default_stream


@contextlib.contextmanager
def stream(stream: Stream | None):
    """Within the block, work given no stream goes to `stream` on this thread (None: no change,
    as torch.cuda.stream(None))."""
    if stream is None:
        yield None
        return
    if not isinstance(stream, Stream):
        from .errors import InvalidParamError
        raise InvalidParamError(f"npumem.stream() takes an npumem.Stream, got {type(stream).__name__}")
    RUNTIME.lazy_context()
    with RUNTIME.using_stream(stream):
        yield stream


def synchronize(device: int | None = None) -> None:
    """Wait for all work on every stream of `device` (default: the current one)."""
    from .runtime.control import synchronize_device

    RUNTIME.lazy_context()
    synchronize_device(device)
