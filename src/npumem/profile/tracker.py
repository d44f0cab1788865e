"""The tracker: every device allocation and free made through npumem, as it happens.

    with npumem.profile.track(stacks=True) as tracker:
        run_step()
    print(tracker.leaks())

A tracker is an observer (`npumem.observe`): while started it receives the events of the
runtime's malloc/free and of every caching pool. It keeps the last `max_entries` events in a ring
buffer, the allocations still live (for leak reports, unbounded by the ring), running totals per
device (allocated, reserved, active and their peaks) and annotations: user marks and ranges and
the ops the streams ran. Several trackers may run at once; each sees everything.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from typing import NamedTuple

from ..errors import InvalidParamError
from ..observe import OBSERVERS, TAGS
from . import stacks as stack_capture
from .growth import Growth, find_growth
from .leaks import LeakReport
from .stacks import Frame, capture
from .torch_memory import TorchMemory

# What each action does to the device's (allocated, active, reserved) bytes.
_DELTAS = {
    "alloc": (1, 1, 0), "free": (-1, -1, 0), "free_requested": (-1, 0, 0),
    "free_completed": (0, -1, 0), "segment_alloc": (0, 0, 1), "segment_map": (0, 0, 1),
    "segment_free": (0, 0, -1), "segment_unmap": (0, 0, -1), "oom": (0, 0, 0),
}


class MemoryEvent(NamedTuple):
    """One event, with the device's totals right after it."""

    seq: int
    time_ns: int                   # time.perf_counter_ns()
    action: str                    # see npumem.observe
    source: str                    # "pool" or "driver" (runtime malloc)
    device: int
    address: int
    size: int                      # block bytes
    requested: int                 # bytes the caller asked for
    stream: int                    # stream handle, 0 = default
    tag: str                       # op or user range that allocated
    frames: tuple[Frame, ...]      # innermost first; empty without stacks
    allocated: int
    reserved: int
    active: int


class Annotation(NamedTuple):
    kind: str                      # "mark" | "range" | "op"
    name: str
    start_ns: int
    end_ns: int
    thread: int                    # thread id (marks, ranges) or stream handle (ops)
    device: int


class DeviceTotals:
    """Running totals of one device of one backend, and its live allocations by address."""

    __slots__ = ("device", "allocated", "reserved", "active", "peak_allocated", "peak_reserved",
                 "live")

    def __init__(self, device: int):
        self.device = device
        self.allocated = self.reserved = self.active = 0
        self.peak_allocated = self.peak_reserved = 0
        self.live: dict = {}              # address -> raw alloc event


_BATCH = 2048                       # raw events queued before they are applied


def _stream_id(stream) -> int:
    return getattr(stream, "handle", stream) or 0


KERNELS_KEPT = 256        # AI core timelines kept (each holds every instruction)

class Tracker:
    """Records allocations while started. Use as a context manager, decorator, or start/stop."""

    def __init__(self, stacks: bool = False, max_entries: int = 1_000_000, max_frames: int = 16,
                 torch_memory: bool | None = None):
        if max_entries <= 0:
            raise InvalidParamError(f"max_entries must be positive, got {max_entries}")
        if max_frames <= 0:
            raise InvalidParamError(f"max_frames must be positive, got {max_frames}")
        self.stacks, self.max_entries, self.max_frames = stacks, max_entries, max_frames
        self.lock = threading.Lock()
        self._events: deque = deque(maxlen=max_entries)
        self._annotations: deque = deque(maxlen=max_entries)
        self._kernels: deque = deque(maxlen=KERNELS_KEPT)     # (start_ns, device, timeline)
        self._totals: dict = {}                 # (backend id, device) -> DeviceTotals
        self._slots: dict = {}                  # (owner, device) -> (source, DeviceTotals)
        self._stream_ids: dict = {None: 0}      # stream object -> handle
        self._pending: deque = deque()          # raw events not yet applied (see on_memory)
        self._next_seq = 0
        self.dropped = 0                        # events pushed out of the ring buffer
        self.started_ns = 0
        self.started_wall_us = 0.0              # wall clock at start, to date the events
        self._starts = 0
        # PyTorch's own memory, when the program uses torch: on a GPU/NPU unless False; on the
        # CPU (torch.profiler, slow) only if True.
        self.torch_memory = None if torch_memory is False else \
            TorchMemory(max_entries, cpu=bool(torch_memory))

    # --- on / off --------------------------------------------------------------------------

    def start(self) -> "Tracker":
        if self._starts == 0:
            self.started_ns = time.perf_counter_ns()
            self.started_wall_us = time.time() * 1e6
            OBSERVERS.add(self)
            if self.torch_memory is not None:
                self.torch_memory.start()
        self._starts += 1
        return self

    def stop(self) -> "Tracker":
        if self._starts:
            self._starts -= 1
            if self._starts == 0:
                OBSERVERS.remove(self)
                if self.torch_memory is not None:
                    self.torch_memory.stop()
        return self

    def torch_snapshot(self) -> dict | None:
        """What PyTorch's own allocator did while tracking, as a snapshot in PyTorch's format
        (`npumem report`/`replay`/`tune` read it); None when torch was not used."""
        return self.torch_memory.snapshot() if self.torch_memory is not None else None

    @property
    def running(self) -> bool:
        return self._starts > 0

    def __enter__(self) -> "Tracker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __call__(self, function):
        """Track every call of `function`."""
        @functools.wraps(function)
        def tracked(*args, **kwargs):
            with self:
                return function(*args, **kwargs)
        return tracked

    # --- the observer side (hot path) ------------------------------------------------------

    def _slot(self, owner, device) -> tuple:
        """(source, totals) of an owner on a device; owners on one backend device share totals."""
        backend = owner.backend if hasattr(owner, "backend") else owner
        key = (id(backend), device)
        totals = self._totals.get(key)
        if totals is None:
            totals = self._totals[key] = DeviceTotals(device)
        slot = self._slots[(owner, device)] = ("pool" if backend is not owner else "driver", totals)
        return slot

    def on_memory(self, owner, action, device, address, size, requested, stream,
                  _now=time.perf_counter_ns, _tags=TAGS, _batch=_BATCH) -> None:
        # The hot path only queues the raw event; totals, the live map and the ring buffer are
        # brought up to date in batches (`_drain`), which costs far less per event than doing
        # it here with a lock taken for each one. (The defaults make those names local.)
        pending = self._pending
        pending.append((_now(), action, owner, device, address, size, requested, stream,
                        _tags.tag, capture(self.max_frames, 2) if self.stacks and action == "alloc"
                        else None))     # skip 2: this method and the allocator calling it
        if len(pending) >= _batch and self.lock.acquire(False):
            try:
                self._drain()
            finally:
                self.lock.release()

    def _drain(self) -> None:
        """Apply the queued raw events in order (call with the lock held)."""
        pending, events, stream_ids = self._pending, self._events, self._stream_ids
        seq, room = self._next_seq, self.max_entries - len(events)
        last_key, slot = None, None            # consecutive events mostly share an owner
        while pending:
            now, action, owner, device, address, size, requested, stream, tag, frames = \
                pending.popleft()
            if (owner, device) != last_key:
                last_key = (owner, device)
                slot = self._slots.get(last_key) or self._slot(owner, device)
            source, totals = slot
            d_allocated, d_active, d_reserved = _DELTAS[action]
            if d_allocated:
                allocated = totals.allocated = totals.allocated + d_allocated * size
                if allocated > totals.peak_allocated:
                    totals.peak_allocated = allocated
            if d_active:
                totals.active += d_active * size
            if d_reserved:
                reserved = totals.reserved = totals.reserved + d_reserved * size
                if reserved > totals.peak_reserved:
                    totals.peak_reserved = reserved
            stream_id = stream_ids.get(stream)
            if stream_id is None:
                stream_id = stream_ids[stream] = _stream_id(stream)
            # Only atomic values (the stream's handle, not the stream): the garbage collector
            # stops tracking such tuples, so a million stored events cost it nothing.
            event = (seq, now, action, source, device, address, size, requested, stream_id, tag,
                     frames, totals.allocated, totals.reserved, totals.active)
            seq += 1
            events.append(event)
            if d_allocated > 0:
                totals.live[address] = event
            elif d_allocated:
                totals.live.pop(address, None)
        added = seq - self._next_seq
        if added > room:
            self.dropped += added - max(room, 0)
        self._next_seq = seq

    def on_op(self, name, device, stream, start_ns, end_ns) -> None:
        with self.lock:
            self._annotations.append(Annotation("op", name, start_ns, end_ns, _stream_id(stream), device))

    def on_kernel(self, timeline, device, stream, start_ns) -> None:
        with self.lock:
            self._kernels.append((start_ns, device, timeline))

    def kernels(self) -> list[tuple]:
        """(start_ns, device, Timeline) of the kernel launches seen, oldest first."""
        with self.lock:
            return list(self._kernels)

    def annotate(self, kind: str, name: str, start_ns: int, end_ns: int,
                 device: int = -1) -> None:
        with self.lock:
            self._annotations.append(Annotation(kind, name, start_ns, end_ns,
                                                threading.get_ident(), device))

    # --- reading ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _applied(self):
        """The lock, with every queued event applied."""
        with self.lock:
            self._drain()
            yield

    @staticmethod
    def _event(raw: tuple) -> MemoryEvent:
        return MemoryEvent(*raw[:10], stack_capture.resolve(raw[10]), *raw[11:])

    def events(self) -> list[MemoryEvent]:
        """The events in the ring buffer, oldest first."""
        with self._applied():
            raw = list(self._events)
        return [self._event(r) for r in raw]

    def annotations(self) -> list[Annotation]:
        with self.lock:
            return list(self._annotations)

    def live(self) -> list[MemoryEvent]:
        """The alloc events of allocations not freed yet, oldest first."""
        with self._applied():
            raw = sorted(r for totals in self._totals.values() for r in totals.live.values())
        return [self._event(r) for r in raw]

    def devices(self) -> dict[int, dict]:
        """Per device: current and peak allocated/reserved bytes (summed over its owners)."""
        out: dict[int, dict] = {}
        with self._applied():
            for totals in self._totals.values():
                entry = out.setdefault(totals.device, dict.fromkeys(
                    ("allocated", "reserved", "active", "peak_allocated", "peak_reserved"), 0))
                for name in entry:
                    entry[name] += getattr(totals, name)
        return out

    def peak_allocated(self) -> int:
        return max((d["peak_allocated"] for d in self.devices().values()), default=0)

    def wall_us(self, time_ns: int) -> float:
        """Wall-clock microseconds (epoch) of a perf_counter_ns time."""
        return self.started_wall_us + (time_ns - self.started_ns) / 1e3

    def leaks(self) -> LeakReport:
        """Allocations made while tracking and still live, grouped by allocation site."""
        return LeakReport(self.live())

    def growth(self) -> list[Growth]:
        """Sites whose live bytes kept rising over the run's steps (profile.range) or over the
        run: probable leaks, with their rate. Works while the program still runs."""
        return find_growth(self.events(), self.annotations())
