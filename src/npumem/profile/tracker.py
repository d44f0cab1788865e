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

import functools
import itertools
import threading
import time
from collections import deque
from typing import NamedTuple

from ..errors import InvalidParamError
from ..observe import OBSERVERS, current_tag
from . import stacks as stack_capture
from .stacks import Frame

# What each action does to (allocated, active) bytes of its device; segment actions move reserved.
_ALLOCATED = {"alloc": 1, "free": -1, "free_requested": -1}
_ACTIVE = {"alloc": 1, "free": -1, "free_completed": -1}
_RESERVED = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


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
    __slots__ = ("allocated", "reserved", "active", "peak_allocated", "peak_reserved")

    def __init__(self):
        self.allocated = self.reserved = self.active = 0
        self.peak_allocated = self.peak_reserved = 0


def _stream_id(stream) -> int:
    return getattr(stream, "handle", stream) or 0


class Tracker:
    """Records allocations while started. Use as a context manager, decorator, or start/stop."""

    def __init__(self, stacks: bool = False, max_entries: int = 1_000_000, max_frames: int = 16):
        if max_entries <= 0:
            raise InvalidParamError(f"max_entries must be positive, got {max_entries}")
        if max_frames <= 0:
            raise InvalidParamError(f"max_frames must be positive, got {max_frames}")
        self.stacks, self.max_entries, self.max_frames = stacks, max_entries, max_frames
        self.lock = threading.Lock()
        self._events: deque = deque(maxlen=max_entries)
        self._annotations: deque = deque(maxlen=max_entries)
        self._live: dict = {}                   # (device key, address) -> raw alloc event
        self._totals: dict = {}                 # device key -> DeviceTotals
        self._devices: dict = {}                # device key -> device index
        self._seq = itertools.count()
        self.dropped = 0                        # events pushed out of the ring buffer
        self.started_ns = self.stopped_ns = 0
        self.started_wall_us = 0.0              # wall clock at start, to date the events
        self._starts = 0

    # --- on / off --------------------------------------------------------------------------

    def start(self) -> "Tracker":
        if self._starts == 0:
            self.started_ns = time.perf_counter_ns()
            self.started_wall_us = time.time() * 1e6
            OBSERVERS.add(self)
        self._starts += 1
        return self

    def stop(self) -> "Tracker":
        if self._starts:
            self._starts -= 1
            if self._starts == 0:
                OBSERVERS.remove(self)
                self.stopped_ns = time.perf_counter_ns()
        return self

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

    def on_memory(self, owner, action, device, address, size, requested, stream) -> None:
        now = time.perf_counter_ns()
        frames = stack_capture.capture(self.max_frames) if self.stacks and action == "alloc" else None
        backend = getattr(owner, "backend", owner)
        source = "pool" if backend is not owner else "driver"
        key = (id(backend), device)
        with self.lock:
            totals = self._totals.get(key)
            if totals is None:
                totals = self._totals[key] = DeviceTotals()
                self._devices[key] = device
            sign = _ALLOCATED.get(action)
            if sign:
                totals.allocated += sign * size
                if totals.allocated > totals.peak_allocated:
                    totals.peak_allocated = totals.allocated
            sign = _ACTIVE.get(action)
            if sign:
                totals.active += sign * size
            sign = _RESERVED.get(action)
            if sign:
                totals.reserved += sign * size
                if totals.reserved > totals.peak_reserved:
                    totals.peak_reserved = totals.reserved
            events = self._events
            if len(events) == self.max_entries:
                self.dropped += 1
            event = (next(self._seq), now, action, source, device, address, size, requested,
                     _stream_id(stream), current_tag(), frames,
                     totals.allocated, totals.reserved, totals.active)
            events.append(event)
            if action == "alloc":
                self._live[(key, address)] = event
            elif action == "free" or action == "free_requested":
                self._live.pop((key, address), None)

    def on_op(self, name, device, stream, start_ns, end_ns) -> None:
        with self.lock:
            self._annotations.append(Annotation("op", name, start_ns, end_ns, _stream_id(stream), device))

    def annotate(self, kind: str, name: str, start_ns: int, end_ns: int) -> None:
        with self.lock:
            self._annotations.append(Annotation(kind, name, start_ns, end_ns,
                                                threading.get_ident(), -1))

    # --- reading ---------------------------------------------------------------------------

    @staticmethod
    def _event(raw: tuple) -> MemoryEvent:
        return MemoryEvent(*raw[:10], stack_capture.resolve(raw[10]), *raw[11:])

    def events(self) -> list[MemoryEvent]:
        """The events in the ring buffer, oldest first."""
        with self.lock:
            raw = list(self._events)
        return [self._event(r) for r in raw]

    def annotations(self) -> list[Annotation]:
        with self.lock:
            return list(self._annotations)

    def live(self) -> list[MemoryEvent]:
        """The alloc events of allocations not freed yet, oldest first."""
        with self.lock:
            raw = sorted(self._live.values())
        return [self._event(r) for r in raw]

    def live_since(self, seq: int) -> list[MemoryEvent]:
        """Allocations made after event number `seq` and still live."""
        with self.lock:
            raw = sorted(r for r in self._live.values() if r[0] > seq)
        return [self._event(r) for r in raw]

    def last_seq(self) -> int:
        with self.lock:
            return self._events[-1][0] if self._events else -1

    def devices(self) -> dict[int, dict]:
        """Per device: current and peak allocated/reserved bytes (summed over its owners)."""
        out: dict[int, dict] = {}
        with self.lock:
            for key, totals in self._totals.items():
                entry = out.setdefault(self._devices[key], dict.fromkeys(
                    ("allocated", "reserved", "active", "peak_allocated", "peak_reserved"), 0))
                for name in entry:
                    entry[name] += getattr(totals, name)
        return out

    def peak_allocated(self) -> int:
        return max((d["peak_allocated"] for d in self.devices().values()), default=0)

    def reset_peaks(self) -> None:
        with self.lock:
            for totals in self._totals.values():
                totals.peak_allocated, totals.peak_reserved = totals.allocated, totals.reserved

    def wall_us(self, time_ns: int) -> float:
        """Wall-clock microseconds (epoch) of a perf_counter_ns time."""
        return self.started_wall_us + (time_ns - self.started_ns) / 1e3

    def leaks(self, since: int = -1):
        """Allocations still live (made after event `since`), grouped by allocation site."""
        from .leaks import LeakReport
        return LeakReport(self.live_since(since))
