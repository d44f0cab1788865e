"""Process-wide runtime state: init/finalize, devices, contexts, the current context per thread.

Like AscendCL, `set_device` makes the device's default context current on the calling thread and
counts references; `reset_device` releases the device when the count drops to zero, reporting
(and freeing) memory still allocated on it. A thread that never set a device or context uses the
context most recently made current in the process, so worker threads of a program that called
`set_device` once keep working.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import warnings

from ..device.address_index import Allocation, summarize
from ..device.backend import DeviceBackend
from ..device.select import check_spec, default_spec, make_backend
from ..errors import (
    ContextNullError, ContextReleaseError, InvalidDeviceError, InvalidHandleError,
    InvalidParamError, AclError,
    RepeatFinalizeError, RepeatInitializeError, UninitializedError, LiveAllocationsWarning,
    user_stacklevel,
    ACL_ERROR_INVALID_FILE, integer_argument,
)
from .handles import forget, lookup, new_handle
from .stream import DEFAULTS, Stream

log = logging.getLogger("npumem")


class Context:
    """A device plus the streams created in it; every context has its own default stream."""

    def __init__(self, device: int, is_default: bool, backend: DeviceBackend):
        self.handle = new_handle(self)
        self.device = device
        self.is_default = is_default
        self.destroyed = False
        self.backend = backend
        self.default_stream = self.new_stream(is_default=True)
        self.streams: list[Stream] = []

    def __repr__(self) -> str:
        return f"<npumem context 0x{self.handle:x} on device {self.device}>"

    def new_stream(self, is_default: bool = False) -> Stream:
        return Stream(self.device, context=self, is_default=is_default,
                      runner=self.backend.stream_runner(self.device))

    def check_alive(self) -> None:
        if self.destroyed:
            raise InvalidHandleError(f"context 0x{self.handle:x} was destroyed")

    def destroy(self) -> list[AclError]:
        """Finish and stop every stream of this context; returns the errors work still queued
        on them hit (the caller reports them: nothing may be lost silently)."""
        errors = []
        for stream in [*self.streams, self.default_stream]:
            if not stream.destroyed:
                try:
                    stream.destroy()
                except AclError as exc:
                    errors.append(exc)
        self.streams.clear()
        self.destroyed = True
        forget(self.handle)
        return errors


class Runtime:
    """The one runtime of this process (module-level `RUNTIME`)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.backend: DeviceBackend | None = None
        self.device_refs: dict[int, int] = {}
        self.default_contexts: dict[int, Context] = {}
        self.contexts: list[Context] = []
        self.process_context: Context | None = None
        self._thread = threading.local()
        # Layers above (the caching pools) release what they hold on a device before it goes.
        self.device_release_hooks: list = []
        self.stream_destroy_hooks: list = []     # hook(stream): after a stream is destroyed
        self.finalize_hooks: list = []
        self.next_backend: str | DeviceBackend | None = None    # set_backend's choice
        self.peers: set[tuple[int, int]] = set()    # (device, peer) pairs with peer access on

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        return self.backend is not None

    def init(self, config_path: str = "", backend: str | DeviceBackend | None = None) -> None:
        """`backend`: an instance or a name (device/select.py); by default set_backend's
        choice, else NPUMEM_DEVICE, else the simulator."""
        from ..environment_check import check_environment

        with self.lock:
            if self.initialized:
                raise RepeatInitializeError("init was already called; call finalize first")
            check_environment()          # a bad NPUMEM_* switch is an error, not "off"
            if backend is None:
                backend = self.next_backend or default_spec()
            if not isinstance(backend, DeviceBackend):
                sim_config = _read_config_file(config_path) if check_spec(backend) == "sim" else {}
                backend = make_backend(backend, **sim_config)
            self.backend = backend

    def finalize(self) -> list[Allocation]:
        """Tear everything down; returns the device allocations that were still live."""
        from .hostmem import PINNED
        with self.lock:
            if not self.initialized:
                raise RepeatFinalizeError("finalize called without a matching init")
            leaked, errors = [], []
            for device in range(self.backend.device_count):
                leaked += self._release_device(device, errors)
            for exc in errors:              # aclFinalize has no one to return them to
                log.warning("work pending at finalize failed: %s", exc)
            for hook in self.finalize_hooks:
                hook()
            host_leaks = PINNED.release_all()
            if host_leaks:
                _report_leaks("finalize: pinned host memory", host_leaks)
            self.backend.close()
            self.backend = None
            self.peers.clear()
            self.process_context = None
            self._thread = threading.local()
            return leaked + host_leaks

    def require(self) -> DeviceBackend:
        backend = self.backend
        if backend is None:
            raise UninitializedError("the runtime is not initialized; call npumem.init() (acl.init()) first")
        return backend

    # --- devices and contexts ---------------------------------------------------------------

    def check_device(self, device: int) -> int:
        """The device id as an int (anything with __index__, numpy integers included)."""
        backend = self.require()
        try:
            device = integer_argument(device, "device id")
        except InvalidParamError:
            pass                             # said below, with the ids there are
        if not isinstance(device, int) or isinstance(device, bool) or \
                not 0 <= device < backend.device_count:
            raise InvalidDeviceError(
                f"invalid device id {device!r}: this process has {backend.device_count} "
                f"{backend.name} device(s), ids 0..{backend.device_count - 1}"
            )
        return device

    def set_device(self, device: int) -> Context:
        with self.lock:
            device = self.check_device(device)
            self.device_refs[device] = self.device_refs.get(device, 0) + 1
            context = self.default_contexts.get(device)
            if context is None:
                context = self.default_contexts[device] = Context(device, True, self.backend)
                self.contexts.append(context)
            self.make_current(context)
            return context

    def reset_device(self, device: int) -> list[Allocation]:
        """Drop one reference to `device`; at zero, release it and return what was still live."""
        with self.lock:
            device = self.check_device(device)
            refs = self.device_refs.get(device, 0)
            if refs > 1:
                self.device_refs[device] = refs - 1
                return []
            errors: list[AclError] = []
            leaked = self._release_device(device, errors)
            _raise_release_errors(f"reset_device({device})", "the device was released", errors)
            return leaked

    def _release_device(self, device: int, errors: list) -> list[Allocation]:
        self.device_refs.pop(device, None)
        contexts = [c for c in self.contexts if c.device == device]
        for context in contexts:       # queued work ends before the memory it uses goes
            for stream in [context.default_stream, *context.streams]:
                if not stream.destroyed:
                    stream.release_unrecorded_waits(f"device {device} was reset")
                    stream.drain()
        for hook in self.device_release_hooks:
            hook(device)
        for context in [c for c in self.contexts if c.device == device]:
            errors += self._drop_context(context)
        self.default_contexts.pop(device, None)
        leaked = self.backend.release_device(device)
        if leaked:
            _report_leaks(f"reset of device {device}", leaked)
        return leaked

    def make_current(self, context: Context) -> None:
        self._thread.context = context
        self.process_context = context

    def lazy_context(self) -> Context:
        """The current context, starting the runtime and device 0 first when nothing is set,
        as torch.cuda initialises on first use. For the Pythonic API (tensors, npumem.memory,
        streams, the profiler); the AscendCL-style calls stay strict."""
        with self.lock:
            if not self.initialized:
                self.init()
            return self._context_in_use() or self.set_device(0)

    def current_context(self) -> Context:
        self.require()
        context = self._context_in_use()
        if context is None:
            raise ContextNullError("no device is set on this thread; call set_device(id) first")
        return context

    def _context_in_use(self) -> Context | None:
        """This thread's context, else the one most recently made current in the process."""
        # (the thread's own settings read from its dict: getattr with a default on a name the
        # thread never set raises and catches inside, 0.3 us an allocation)
        context = self._thread.__dict__.get("context") or self.process_context
        return None if context is None or context.destroyed else context

    def create_context(self, device: int) -> Context:
        with self.lock:
            self.check_device(device)
            context = Context(device, False, self.backend)
            self.contexts.append(context)
            self.make_current(context)
            return context

    def destroy_context(self, context_or_handle) -> None:
        with self.lock:
            context = lookup(context_or_handle, Context, "destroy_context")
            if context.is_default:
                raise InvalidParamError(
                    f"{context!r} is the default context of device {context.device}; "
                    "it goes away with reset_device"
                )
            errors = self._drop_context(context)
        _raise_release_errors("destroy_context", "the context was destroyed", errors)

    def _drop_context(self, context: Context) -> list[AclError]:
        errors = context.destroy()
        self.contexts.remove(context)
        if getattr(self._thread, "context", None) is context:
            self._thread.context = None
        if self.process_context is context:
            self.process_context = None
        return errors

    # --- streams ----------------------------------------------------------------------------

    def stream(self, stream_or_handle, what: str) -> Stream:
        """Resolve a stream argument; None or 0 means the current context's default stream."""
        self.require()
        if stream_or_handle is None or (isinstance(stream_or_handle, int)
                                        and not isinstance(stream_or_handle, bool)
                                        and stream_or_handle == 0):
            return self._stream_in_use(self.current_context())
        return lookup(stream_or_handle, Stream, what)

    def create_stream(self) -> Stream:
        context = self.current_context()
        stream = context.new_stream()
        context.streams.append(stream)
        return stream

    def context_for_new_stream(self, device) -> Context:
        """Where `npumem.Stream(device)` goes (the stream registers itself there): the current
        context, or `device`'s default one, opened if need be but not made current (as
        torch.cuda.Stream(device) leaves the current device alone); lazy init."""
        context = self.lazy_context()
        if device is None or self.check_device(device) == context.device:
            return context
        with self.lock:
            other = self.default_contexts.get(device)
            if other is None:
                other = self.set_device(device)
                self.make_current(context)
            return other

    def current_stream(self) -> Stream:
        """The stream work goes to when none is given: the one `npumem.stream(s)` set on this
        thread, else the current context's default stream; lazy init."""
        return self._stream_in_use(self.lazy_context())

    def _stream_in_use(self, context: Context) -> Stream:
        stream = self._thread.__dict__.get("stream")       # npumem.stream(s) on this thread
        if stream is not None and not stream.destroyed and stream.context is context:
            return stream
        return context.default_stream

    @contextlib.contextmanager
    def using_stream(self, stream: Stream | None):
        """Within the block, work with no stream given goes to `stream` on this thread."""
        previous = getattr(self._thread, "stream", None)
        self._thread.stream = stream
        try:
            yield stream
        finally:
            self._thread.stream = previous

    def destroy_stream(self, stream_or_handle) -> None:
        stream = self.stream(stream_or_handle, "destroy_stream")
        if stream.is_default:
            raise InvalidParamError(f"{stream!r} is a default stream; it cannot be destroyed")
        try:
            stream.destroy()
        finally:
            owner = stream.context
            if stream in owner.streams:
                owner.streams.remove(stream)
            for hook in self.stream_destroy_hooks:
                hook(stream)


def _raise_release_errors(call: str, done: str, errors: list[AclError]) -> None:
    """After a teardown that went through: the errors its streams' pending work hit, as one
    ContextReleaseError (CANN's aclrtResetDevice returns the context release's failure)."""
    if errors:
        detail = "; ".join(exc.message for exc in errors)
        raise ContextReleaseError(f"{call}: {done}, but work still queued on its streams failed: "
                                  f"{detail}") from errors[0]


def _report_leaks(where: str, allocations: list[Allocation]) -> None:
    warnings.warn(f"{where}: {summarize(allocations)}", LiveAllocationsWarning,
                  stacklevel=user_stacklevel())         # the user's reset or finalize


def _read_config_file(path: str) -> dict:
    """The optional aclInit JSON file; npumem reads its "npumem_sim" section if present."""
    if not path:
        return {}
    if not os.path.isfile(path):
        raise AclError(f"init: config file {path!r} does not exist", ACL_ERROR_INVALID_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle) if os.path.getsize(path) else {}
    except (OSError, ValueError) as exc:
        raise AclError(f"init: cannot read {path!r} as JSON: {exc}", ACL_ERROR_INVALID_FILE) from None
    section = config.get("npumem_sim", {}) if isinstance(config, dict) else {}
    allowed = {"devices", "memory", "huge_memory", "memory_kind"}
    unknown = set(section) - allowed
    if unknown:
        raise AclError(f"init: {path!r}: unknown npumem_sim keys {sorted(unknown)}; "
                       f"allowed: {sorted(allowed)}", ACL_ERROR_INVALID_FILE)
    from ..units import parse_size
    return {k: parse_size(v) if k in ("memory", "huge_memory") else v for k, v in section.items()}


RUNTIME = Runtime()
DEFAULTS.context_for_new_stream = RUNTIME.context_for_new_stream
DEFAULTS.current_stream = RUNTIME.current_stream
