"""Lifecycle, devices, contexts, streams and events: the Pythonic AscendCL control API."""

from __future__ import annotations

from ..device.address_index import Allocation
from ..device.backend import DeviceBackend
from ..device.select import check_spec, default_spec, device_count_of
import time

from ..errors import (
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID,
    ACL_ERROR_RT_INTERNAL_ERROR, ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, AclError,
    FeatureNotSupportedError, InvalidDeviceError, InvalidParamError, StreamNotCompleteError,
    integer_argument,
)
from .callbacks import SUBSCRIPTIONS
from .dependencies import GRAPH, Dependency
from .handles import lookup
from .state import RUNTIME, Context
from .stream import Event, Stream, WaitSettings


def init(config_path: str = "", *, backend: str | DeviceBackend | None = None) -> None:
    """Start the runtime on `backend`: a backend instance or a name ("sim", "torch:cpu",
    "torch:cuda", "torch:npu", "torch"). By default the one `set_backend` chose, else
    NPUMEM_DEVICE, else a simulated NPU configured from NPUMEM_SIM_*.

    `config_path` is the aclInit JSON file; npumem reads an optional "npumem_sim" section
    (devices, memory, huge_memory, memory_kind) from it for the simulator.
    """
    RUNTIME.init(config_path, backend)


def set_backend(backend: str | DeviceBackend) -> None:
    """Choose the backend the next `init` uses (a name or an instance); checked now."""
    if RUNTIME.initialized:
        raise InvalidParamError(f"set_backend({backend!r}): the runtime already runs on "
                                f"{RUNTIME.backend.name}; call finalize() first")
    if not isinstance(backend, DeviceBackend):
        check_spec(backend)
    RUNTIME.next_backend = backend


def get_backend() -> DeviceBackend:
    """The backend the runtime runs on."""
    return RUNTIME.require()


def native_pointer(pointer: int) -> int:
    """The real address behind npumem device pointer `pointer`: a CUDA/NPU device pointer on
    torch:cuda / torch:npu, a host address on torch:cpu and the simulator."""
    return RUNTIME.require().native_pointer(pointer)


def finalize() -> list[Allocation]:
    """Stop the runtime; memory still allocated is reported (a warning) and released."""
    SUBSCRIPTIONS.clear()
    return RUNTIME.finalize()


def is_initialized() -> bool:
    return RUNTIME.initialized


def set_device(device: int) -> None:
    """Use `device` on this thread (its default context); counts references."""
    RUNTIME.set_device(device)


def reset_device(device: int) -> list[Allocation]:
    """Undo one set_device; the last one releases the device and returns leaked allocations."""
    return RUNTIME.reset_device(device)


def get_device() -> int:
    return RUNTIME.current_context().device


def get_device_count() -> int:
    """Devices the backend drives; before init, those the next init would drive (CANN answers
    before aclInit too)."""
    if RUNTIME.initialized:
        return RUNTIME.backend.device_count
    return device_count_of(RUNTIME.next_backend or default_spec())


# --- peer access: copies between two devices -------------------------------------------------

def _device_index(device, what: str) -> int:
    device = integer_argument(device, what)
    count = RUNTIME.require().device_count
    if not 0 <= device < count:
        raise InvalidDeviceError(f"{what}: no device {device} (this runtime has {count})")
    return device


def device_can_access_peer(device: int, peer_device: int) -> bool:
    """Whether `device` can reach `peer_device`'s memory: any two different devices of one
    backend can (they share one simulated or PyTorch address space)."""
    device = _device_index(device, "device_can_access_peer: device")
    peer = _device_index(peer_device, "device_can_access_peer: peer_device")
    if device == peer:
        raise InvalidParamError(f"device_can_access_peer: device and peer_device are both "
                                f"{device}; ask about two different devices")
    return True


def device_enable_peer_access(peer_device: int, flags: int = 0) -> None:
    """Let the current device copy to and from `peer_device` (flags must be 0, as in CANN)."""
    device = RUNTIME.current_context().device
    peer = _device_index(peer_device, "device_enable_peer_access: peer_device")
    if integer_argument(flags, "device_enable_peer_access: flags") != 0:
        raise InvalidParamError(f"device_enable_peer_access: flags must be 0, got {flags}")
    if peer == device:
        raise InvalidParamError(f"device_enable_peer_access: {peer} is the current device")
    RUNTIME.peers.add((device, peer))


def device_disable_peer_access(peer_device: int) -> None:
    device = RUNTIME.current_context().device
    peer = _device_index(peer_device, "device_disable_peer_access: peer_device")
    if (device, peer) not in RUNTIME.peers:
        raise InvalidParamError(f"device_disable_peer_access: access from device {device} to "
                                f"{peer} was not enabled")
    RUNTIME.peers.discard((device, peer))


def synchronize_device(device: int | None = None, timeout: float | None = None) -> None:
    """Wait for every stream of every context on the current device (or `device`); with
    `timeout` (seconds), StreamNotCompleteError when they are not all idle by then."""
    current = RUNTIME.current_context().device
    device = current if device is None else RUNTIME.check_device(device)
    deadline = None if timeout is None else time.monotonic() + timeout
    for context in [c for c in RUNTIME.contexts if c.device == device]:
        for stream in [context.default_stream, *context.streams]:
            if not stream.destroyed:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                stream.synchronize(left)


def create_context(device: int) -> Context:
    """A new context on `device`, made current on this thread."""
    return RUNTIME.create_context(device)


def destroy_context(context) -> None:
    RUNTIME.destroy_context(context)


def set_context(context) -> None:
    RUNTIME.require()
    RUNTIME.make_current(lookup(context, Context, "set_context"))


def get_context() -> Context:
    return RUNTIME.current_context()


def create_stream() -> Stream:
    """A new stream in the current context, with its own worker thread."""
    return RUNTIME.create_stream()


def destroy_stream(stream) -> None:
    """Finish the stream's work and stop it (a blocking callback no thread runs gives up)."""
    SUBSCRIPTIONS.forget_stream(RUNTIME.stream(stream, "destroy_stream"))
    RUNTIME.destroy_stream(stream)


# aclrtCreateStreamWithConfig flags: the simulator honours the first three as no-ops (its
# streams launch and synchronize one way), the rest bind a stream to models or device-side
# scheduling, which npumem does not run.
STREAM_FAST_LAUNCH, STREAM_FAST_SYNC, STREAM_PERSISTENT = 0x1, 0x2, 0x4
STREAM_HUGE, STREAM_CPU_SCHEDULE, STREAM_DEVICE_USE_ONLY = 0x8, 0x10, 0x20
_UNSUPPORTED_STREAM_FLAGS = {STREAM_PERSISTENT: "PERSISTENT (streams bound to a model)",
                             STREAM_CPU_SCHEDULE: "CPU_SCHEDULE",
                             STREAM_DEVICE_USE_ONLY: "DEVICE_USE_ONLY"}


def create_stream_with_config(priority: int, flags: int) -> Stream:
    """aclrtCreateStreamWithConfig: a stream with a priority (0 highest .. 7 lowest; outside,
    moved to the nearer bound, as CANN does) and ACL_STREAM_* flags. Unknown bits are ignored
    (CANN makes a plain stream of them)."""
    priority = integer_argument(priority, "create_stream_with_config: priority")
    flags = integer_argument(flags, "create_stream_with_config: flag")
    if flags < 0:
        raise InvalidParamError(f"create_stream_with_config: flag must not be negative, got {flags}")
    refused = [name for bit, name in _UNSUPPORTED_STREAM_FLAGS.items() if flags & bit]
    if refused:
        raise FeatureNotSupportedError(f"create_stream_with_config: flag {', '.join(refused)} is "
                                       "not supported by npumem (no models or device-side "
                                       "scheduling); FAST_LAUNCH, FAST_SYNC and HUGE are")
    stream = RUNTIME.create_stream()
    stream.priority = min(max(priority, 0), 7)
    stream.flags = flags & (STREAM_FAST_LAUNCH | STREAM_FAST_SYNC | STREAM_HUGE)
    return stream


def timeout_ms(value, what: str) -> float | None:
    """An AscendCL timeout in milliseconds as seconds: -1 waits forever (None), 0 only looks;
    below -1 is ACL_ERROR_RT_PARAM_INVALID, as CANN checks it."""
    value = integer_argument(value, f"{what}: timeout")
    if value < -1:
        raise InvalidParamError(f"{what}: timeout must be -1 (forever) or >= 0 ms, got {value}",
                                107000)
    return None if value == -1 else value / 1000


def _within(timeout, what: str, code: int, wait) -> None:
    """`wait(seconds)` for `timeout` ms (-1: forever); AclError `code` when it runs out."""
    seconds = timeout_ms(timeout, what)
    try:
        wait(seconds)
    except StreamNotCompleteError as exc:
        raise AclError(exc.message, code) from None


def synchronize_stream_timeout_ms(stream, timeout) -> None:
    """aclrtSynchronizeStreamWithTimeout: ACL_ERROR_RT_STREAM_SYNC_TIMEOUT when not idle in time."""
    _within(timeout, "synchronize_stream_with_timeout", ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
            lambda seconds: synchronize_stream(stream, seconds))


def synchronize_device_timeout_ms(timeout) -> None:
    """aclrtSynchronizeDeviceWithTimeout: ACL_ERROR_RT_STREAM_SYNC_TIMEOUT on timeout."""
    _within(timeout, "synchronize_device_with_timeout", ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
            lambda seconds: synchronize_device(None, seconds))


def synchronize_event_timeout_ms(event, timeout) -> None:
    """aclrtSynchronizeEventWithTimeout: ACL_ERROR_RT_EVENT_SYNC_TIMEOUT on timeout."""
    _within(timeout, "synchronize_event_with_timeout", ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
            lambda seconds: synchronize_event(event, seconds))


def synchronize_stream(stream=None, timeout: float | None = None) -> None:
    """Wait until `stream` (None: the default stream) is idle; raise errors its work hit."""
    RUNTIME.stream(stream, "synchronize_stream").synchronize(timeout)


def query_stream(stream=None) -> bool:
    """True when every task queued on `stream` has finished."""
    return RUNTIME.stream(stream, "query_stream").query()


def create_event() -> Event:
    RUNTIME.require()
    return Event()


# aclrtCreateEventWithFlag: ACL_EVENT_SYNC, CAPTURE_STREAM_PROGRESS, (runtime's DDSYNC,) TIME_LINE
# combine; DEVICE_USE_ONLY and EXTERNAL stand alone; IPC (Ex only) stands alone.
EVENT_COMBINABLE = 0x1 | 0x2 | 0x4 | 0x8
EVENT_DEVICE_USE_ONLY, EVENT_EXTERNAL, EVENT_IPC = 0x10, 0x20, 0x40


def create_event_with_flag(flag: int, reusable: bool = False) -> Event:
    """aclrtCreateEventWithFlag (`reusable`: aclrtCreateEventExWithFlag), with CANN's flag
    checks: a non-empty OR of the combinable flags, or one of the solitary ones alone; else
    ACL_ERROR_RT_PARAM_INVALID. Every npumem event records time and is reusable, so the flags
    change nothing else; an IPC event (shared between processes) is not supported."""
    what = "create_event_ex_with_flag" if reusable else "create_event_with_flag"
    flag = integer_argument(flag, f"{what}: flag")
    alone = (EVENT_IPC,) if reusable else (EVENT_DEVICE_USE_ONLY, EVENT_EXTERNAL)
    valid = (flag > 0 and flag & ~EVENT_COMBINABLE == 0) or flag in alone
    if not valid:
        raise InvalidParamError(f"{what}: flag 0x{flag:x} is not an OR of ACL_EVENT_SYNC (0x1), "
                                "CAPTURE_STREAM_PROGRESS (0x2), TIME_LINE (0x8), nor one of "
                                + " or ".join(f"0x{bit:x}" for bit in alone) + " alone", 107000)
    if flag == EVENT_IPC:
        raise FeatureNotSupportedError(f"{what}: IPC events (shared between processes) are not "
                                       "supported by npumem")
    RUNTIME.require()
    event = Event(enable_timing=True)
    event.flags = flag
    return event


def query_event_status(event, call: str = "query_event_status") -> bool:
    """aclrtQueryEventStatus (and aclrtQueryEventWaitStatus, `call`: whether a wait would not
    block now, the same thing): True once the event's latest record was reached; an event
    never recorded (or reset) is not (unlike query_event, which calls it complete)."""
    event = lookup(event, Event, call)
    return event.recorded and event.query()


def event_timestamp_us(event) -> int:
    """aclrtEventGetTimestamp: when the event's latest record ran, in microseconds of the
    monotonic clock (time since the machine started, as the NPU counts from its own start).
    Never recorded: ACL_ERROR_RT_INTERNAL_ERROR (CANN's "event recorder null"); recorded but not
    reached yet: ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID."""
    event = lookup(event, Event, "event_get_timestamp")
    if not event.recorded:
        raise AclError(f"event_get_timestamp: {event!r} was never recorded (or was reset)",
                       ACL_ERROR_RT_INTERNAL_ERROR)
    stamp = event.timestamp
    if stamp is None:
        raise AclError(f"event_get_timestamp: {event!r} has not been reached yet; synchronize "
                       "its stream (or the event) first", ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID)
    return int(stamp * 1_000_000)


def destroy_event(event) -> None:
    lookup(event, Event, "destroy_event").destroy()


def record_event(event, stream=None) -> None:
    lookup(event, Event, "record_event").record(RUNTIME.stream(stream, "record_event"))


def reset_event(event, stream=None) -> None:
    RUNTIME.stream(stream, "reset_event")
    lookup(event, Event, "reset_event").reset()


def query_event(event) -> bool:
    return lookup(event, Event, "query_event").query()


def synchronize_event(event, timeout: float | None = None) -> None:
    lookup(event, Event, "synchronize_event").synchronize(timeout)


def stream_wait_event(stream, event) -> None:
    """Work queued on `stream` after this call waits until `event` is reached."""
    lookup(event, Event, "stream_wait_event").make_wait(RUNTIME.stream(stream, "stream_wait_event"))


def event_elapsed_time(start, end) -> float:
    """Milliseconds between two reached events."""
    return lookup(start, Event, "event_elapsed_time").elapsed_ms(
        lookup(end, Event, "event_elapsed_time"))


def set_op_wait_timeout(seconds: float) -> None:
    """aclrtSetOpWaitTimeout: an event wait queued after this call fails (reported at the next
    synchronize) when it blocks longer than `seconds`; 0 waits forever (the default)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise InvalidParamError(f"set_op_wait_timeout: seconds must be a number >= 0, got {seconds!r}")
    WaitSettings.op_wait_timeout = float(seconds) or None


def dependencies() -> list[Dependency]:
    """The cross-stream waits still pending: which stream waits for which event and record."""
    return GRAPH.snapshot()
