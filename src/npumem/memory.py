"""`npumem.memory`: the caching pool behind a `torch.npu.memory`-shaped API.

    import npumem, npumem.memory as mem
    npumem.init(); npumem.set_device(0)
    ptr = mem.caching_allocator_alloc(1 << 20)
    mem.caching_allocator_delete(ptr)
    print(mem.memory_summary())

One pool per device, created on first use with settings from NPUMEM_ALLOC_CONF (or
`set_allocator_settings`). Streams are the runtime's: `None` means the current default stream.
Pools are released with their device (reset_device / finalize); blocks still live are reported.
"""

from __future__ import annotations

import time
import warnings

from .alloc.caching_allocator import CachingAllocator, OutOfMemoryError
from .alloc.host_pool import HostPool
from .alloc.process_pools import POOLS
from .alloc.settings import AllocatorSettings, parse_settings, settings_from_env
from .alloc.summary import format_summary
from .profile.torch_allocator import torch_memory_stats, torch_memory_summary
from .device.sanitizer import SANITIZER
from .constants import MemAttr
from .errors import (InvalidParamError, LiveAllocationsWarning, MemoryFreeError, integer_argument,
                     user_stacklevel)
from .observe import OBSERVERS, STEP_LISTENERS
from .profile.snapshot import build_snapshot
from .profile.tracker import Tracker
from .runtime.state import RUNTIME
from .runtime.stream import Event, Stream
from .trace.step_marks import NPUMEM_STEP

__all__ = [
    "OutOfMemoryError", "caching_allocator_alloc", "caching_allocator_delete", "empty_cache",
    "get_allocator", "get_allocator_settings", "host_pool", "max_memory_allocated",
    "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_snapshot",
    "memory_stats", "memory_summary", "record_memory_history", "record_stream", "reset_peak_memory_stats",
    "step",
    "set_allocator_settings", "set_per_process_memory_fraction",
    "torch_memory_stats", "torch_memory_summary",     # PyTorch's own allocator, live or saved
]

_lock = POOLS.lock
_pools: dict[int, CachingAllocator] = POOLS.by_device
_settings: AllocatorSettings | None = None
_host_pool: HostPool | None = None
_history: Tracker | None = None    # the events memory_snapshot() reports as device_traces


def _stream_idle(stream) -> bool:
    return stream.query() if isinstance(stream, Stream) else True


def _synchronize(stream) -> None:
    if isinstance(stream, Stream) and not stream.destroyed:
        stream.synchronize()


def _record_event(stream) -> Event:
    event = Event()
    if isinstance(stream, Stream) and not stream.destroyed:
        event.record(stream)
    return event


def get_allocator_settings() -> AllocatorSettings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = settings_from_env()
        return _settings


def set_allocator_settings(config: str | AllocatorSettings) -> None:
    """Change settings ("expandable_segments:False,max_split_size_mb:128" or an object).

    Pools without live blocks are rebuilt; a pool with live blocks takes every change except
    expandable_segments, which it refuses with an error until its blocks are freed.
    """
    global _settings
    with _lock:
        new = parse_settings(config, get_allocator_settings()) if isinstance(config, str) else config
        for device, pool in list(_pools.items()):
            if new.expandable_segments != pool.settings.expandable_segments:
                if pool.stats.current("allocation"):
                    raise InvalidParamError(
                        f"expandable_segments cannot change while device {device}'s pool has "
                        f"{pool.stats.current('allocation')} live blocks; free them first")
                pool.close()
                del _pools[device]
            else:
                pool.settings = new
                pool.set_memory_fraction(new.per_process_memory_fraction)
        _settings = new


def _device(device) -> int:
    """`device`, or the current one; the runtime and device 0 start on first use (lazy init)."""
    current = RUNTIME.lazy_context().device
    return current if device is None else RUNTIME.check_device(device)


def get_allocator(device: int | None = None) -> CachingAllocator:
    """The caching pool of `device` (default: the current device)."""
    device = _device(device)
    with _lock:
        pool = _pools.get(device)
        if pool is None:
            pool = _pools[device] = CachingAllocator(
                RUNTIME.backend, device, get_allocator_settings(), stream_idle=_stream_idle,
                synchronize=_synchronize, record_event=_record_event)
        return pool


def _stream(stream):
    RUNTIME.lazy_context()
    return RUNTIME.stream(stream, "caching allocator")


def current_pool_and_stream():
    """(the current device's pool, the current stream) as get_allocator and _stream would find
    them, found without the runtime's lock (it matters only for starting the runtime); None
    when the runtime has no current context or its device no pool yet: then take those."""
    context = RUNTIME._context_in_use()
    if context is None:
        return None
    pool = _pools.get(context.device)
    return None if pool is None else (pool, RUNTIME._stream_in_use(context))


def caching_allocator_alloc(size: int, device: int | None = None, stream=None) -> int:
    """A device pointer from the pool, ordered on `stream` (None: the default stream)."""
    if type(size) is int and device is None and stream is None:     # the common call
        # current_pool_and_stream written out (RUNTIME._context_in_use, _stream_in_use): two
        # calls fewer on the hottest path of the public API; the tests hold it to theirs
        own = RUNTIME._thread.__dict__
        context = own.get("context") or RUNTIME.process_context
        if context is not None and not context.destroyed:
            pool = _pools.get(context.device)
            if pool is not None:
                chosen = own.get("stream")
                if chosen is None or chosen.destroyed or chosen.context is not context:
                    chosen = context.default_stream
                return pool.allocate(size, chosen)
    size = integer_argument(size, "caching_allocator_alloc: size")
    pool = get_allocator(device)
    return pool.allocate(size, _stream(stream))


def _pool_of(pointer: int) -> CachingAllocator:
    backend = RUNTIME.require()
    pool = _pools.get(backend.device_of(pointer)) if backend.is_device_pointer(pointer) else None
    if pool is None or not pool.owns(pointer):
        why = SANITIZER.explain_bad_free(pool, pointer) if pool is not None and SANITIZER.on \
            else None
        raise MemoryFreeError(f"0x{pointer:x} was not allocated by the caching allocator "
                              f"({why or 'double free, or memory from malloc'})")
    return pool


def caching_allocator_delete(pointer: int) -> None:
    if type(pointer) is int and not SANITIZER.on:
        # The common call: a live block of a pool, with no sanitizer record to consult. A
        # pointer a pool holds is one of its device's, so _pool_of's checks all pass.
        backend = RUNTIME.backend
        if backend is not None:
            pool = _pools.get(backend.device_of(pointer))
            if pool is not None and pointer in pool._allocated:     # pool.owns, one call less
                pool.deallocate(pointer)
                return
    pointer = integer_argument(pointer, "caching_allocator_delete: pointer")
    pool = _pool_of(pointer)
    record = SANITIZER.record(pool, pointer)
    if record is not None and record.extra.get("tensor"):
        raise MemoryFreeError(f"caching_allocator_delete(0x{pointer:x}): {record.describe()} is "
                              "the storage of a tensor, which frees it when it is dropped; "
                              "drop the tensor (del t) or call t.storage.free() instead")
    pool.deallocate(pointer)


def step(device: int | None = None) -> None:
    """Mark the end of a training or serving step. With NPUMEM_ALLOC_CONF=predictive:True the
    pool plans the requests of one step and serves the next ones from the plan (without marks
    it finds the repeated step itself, a step later). Running trackers (and
    `record_memory_history`) note it: `memory_snapshot()` has it in "external_annotations",
    so that `npumem replay` marks the step where the program did."""
    pool = get_allocator(device)
    pool.mark_step()
    for listener in STEP_LISTENERS:
        listener()
    if OBSERVERS.active:
        now = time.perf_counter_ns()
        for observer in OBSERVERS.active:
            if isinstance(observer, Tracker):
                observer.annotate("step", NPUMEM_STEP, now, now, pool.device)


def record_stream(pointer: int, stream) -> None:
    """Work on `stream` uses this block: its memory is reused only after that work."""
    pointer = integer_argument(pointer, "record_stream: pointer")
    _pool_of(pointer).record_stream(pointer, _stream(stream))


def record_memory_history(enabled: bool = True, max_entries: int = 100_000,
                          stacks: bool = True) -> None:
    """Keep the last `max_entries` allocation events (with Python stacks unless `stacks` is
    False) for `memory_snapshot()`'s "device_traces", as torch.cuda.memory._record_memory_history
    does. `enabled=False` stops recording and forgets the history."""
    global _history
    if max_entries <= 0:
        raise InvalidParamError(f"max_entries must be positive, got {max_entries}")
    with _lock:
        if _history is not None:
            _history.stop()
        _history = Tracker(stacks=stacks, max_entries=max_entries).start() if enabled else None


def empty_cache() -> None:
    """Give the memory cached by every pool (and the pinned host pool) back to the device."""
    with _lock:
        for pool in _pools.values():
            pool.empty_cache()
        if _host_pool is not None:
            _host_pool.empty_cache()


def set_per_process_memory_fraction(fraction: float, device: int | None = None) -> None:
    get_allocator(device).set_memory_fraction(fraction)


def mem_get_info(device: int | None = None) -> tuple[int, int]:
    """(free, total) bytes of `device`'s memory (default: the current device), as
    torch.cuda.mem_get_info; free counts what the pools cache as used."""
    device = _device(device)
    return RUNTIME.backend.mem_info(device, MemAttr.HBM_MEM)


def memory_stats(device: int | None = None) -> dict:
    return get_allocator(device).memory_stats()


def memory_allocated(device: int | None = None) -> int:
    return get_allocator(device).stats.current("allocated_bytes")


def memory_reserved(device: int | None = None) -> int:
    return get_allocator(device).stats.current("reserved_bytes")


def max_memory_allocated(device: int | None = None) -> int:
    return get_allocator(device).stats.peak("allocated_bytes")


def max_memory_reserved(device: int | None = None) -> int:
    return get_allocator(device).stats.peak("reserved_bytes")


def reset_peak_memory_stats(device: int | None = None) -> None:
    pool = get_allocator(device)
    with pool.lock:
        pool.stats.reset_peaks()


def memory_summary(device: int | None = None, abbreviated: bool = False) -> str:
    device = _device(device)
    return format_summary(memory_stats(device), device, abbreviated)


def memory_snapshot() -> dict:
    """PyTorch's snapshot structure over every device's pool (save it with pickle); with
    `record_memory_history` on, it also has the event history and the driver allocations."""
    with _lock:
        pools = [_pools[device] for device in sorted(_pools)]
        devices = RUNTIME.backend.device_count if RUNTIME.initialized else 0
        return build_snapshot(pools, _history, devices)


def host_pool() -> HostPool:
    """The pinned host memory pool (staging buffers)."""
    global _host_pool
    RUNTIME.require()
    with _lock:
        if _host_pool is None:
            _host_pool = HostPool()
        return _host_pool


def _release_device(device: int) -> None:
    with _lock:
        pool = _pools.pop(device, None)
    if pool is not None:
        live = pool.close()
        if live:
            total = sum(block.size for block in live)
            warnings.warn(f"caching pool of device {device}: {len(live)} block(s), {total} bytes, "
                          "were still allocated", LiveAllocationsWarning,
                          stacklevel=user_stacklevel())


def _finalize() -> None:
    global _host_pool, _settings, _history
    with _lock:
        if _history is not None:
            _history.stop()
            _history = None
        if _host_pool is not None:
            _host_pool.close()
            _host_pool = None
        _settings = None


def _stream_destroyed(stream) -> None:
    with _lock:
        pool = _pools.get(stream.device)
    if pool is not None:
        pool.forget_stream(stream)


RUNTIME.device_release_hooks.append(_release_device)
RUNTIME.stream_destroy_hooks.append(_stream_destroyed)
RUNTIME.finalize_hooks.append(_finalize)
