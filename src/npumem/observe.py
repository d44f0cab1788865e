"""How the profiler sees memory without the allocators knowing about it.

Allocators report to the observers (directly, or through `emit`) only when `OBSERVERS.active` is
non-empty, so with no profiler running the cost is one attribute test. Observers get every event
of every device memory owner (the runtime's malloc and each caching pool):

    observer.on_memory(owner, action, device, address, size, requested, stream)
    observer.on_op(name, device, stream, start_ns, end_ns)
    observer.on_kernel(timeline, device, stream, start_ns)   # optional: AI core timelines

Actions are PyTorch's trace actions — alloc, free_requested, free_completed, segment_alloc,
segment_free, oom — plus `free`, meaning free_requested and free_completed at once (the common
case; one call instead of two keeps tracking cheap). `size` is the block's bytes, `requested`
what the caller asked for (an oom event carries the device's free bytes as its address). Tags
(`tagged("attention")`) name the op or user region that is allocating on this thread.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager


class Observers:
    """The active observers, as a tuple swapped under a lock (readers never lock)."""

    def __init__(self):
        self.active: tuple = ()
        self._lock = threading.Lock()

    def add(self, observer) -> None:
        with self._lock:
            if observer not in self.active:
                self.active = self.active + (observer,)

    def remove(self, observer) -> None:
        with self._lock:
            self.active = tuple(o for o in self.active if o is not observer)


OBSERVERS = Observers()
# Called at each npumem.memory.step(): recorders that mark the program's steps (the tensor
# recorder of PyTorch memory, which sees no npumem allocation)
STEP_LISTENERS: list = []


def emit(owner, action: str, device: int, address: int, size: int, requested: int, stream) -> None:
    for observer in OBSERVERS.active:
        observer.on_memory(owner, action, device, address, size, requested, stream)


def emit_op(name: str, device: int, stream, start_ns: int, end_ns: int) -> None:
    for observer in OBSERVERS.active:
        observer.on_op(name, device, stream, start_ns, end_ns)


class _Tags(threading.local):
    """The tag of the op or user range allocating on each thread."""

    tag = ""                    # a class default: reading it never raises on a new thread


TAGS = _Tags()


@contextmanager
def tagged(tag: str):
    """Allocations made by this thread inside the block carry `tag` (innermost tag wins)."""
    outer = TAGS.tag
    TAGS.tag = tag
    try:
        yield
    finally:
        TAGS.tag = outer


def emit_kernel(timeline, device: int, stream, start_ns: int) -> None:
    """A kernel launch ran: its modelled per-core timeline, started at `start_ns`."""
    for observer in OBSERVERS.active:
        on_kernel = getattr(observer, "on_kernel", None)
        if on_kernel is not None:
            on_kernel(timeline, device, stream, start_ns)
