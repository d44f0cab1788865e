"""Lifecycle, devices, contexts, streams and events: the Pythonic AscendCL control API."""

from __future__ import annotations

from ..device.address_index import Allocation
from ..device.backend import DeviceBackend
from ..device.select import check_spec, default_spec, device_count_of
from ..errors import InvalidDeviceError, InvalidParamError, integer_argument
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


def synchronize_device(device: int | None = None) -> None:
    """Wait for every stream of every context on the current device (or `device`)."""
    current = RUNTIME.current_context().device
    device = current if device is None else RUNTIME.check_device(device)
    for context in [c for c in RUNTIME.contexts if c.device == device]:
        for stream in [context.default_stream, *context.streams]:
            if not stream.destroyed:
                stream.synchronize()


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


def synchronize_stream(stream=None, timeout: float | None = None) -> None:
    """Wait until `stream` (None: the default stream) is idle; raise errors its work hit."""
    RUNTIME.stream(stream, "synchronize_stream").synchronize(timeout)


def query_stream(stream=None) -> bool:
    """True when every task queued on `stream` has finished."""
    return RUNTIME.stream(stream, "query_stream").query()


def create_event() -> Event:
    RUNTIME.require()
    return Event()


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
