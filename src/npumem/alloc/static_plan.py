"""StaticPlan: serve a recorded step from one arena placed ahead of time (memory reuse with no
allocator work at run time).

Record a step's allocations (any trace npumem reads), plan their offsets once, then run the step
again: the k-th request of each step gets the k-th recorded buffer's place in the arena, found by
a counter. Nothing trusts the program to repeat itself exactly: a request whose size differs
from the recording, one past the end of the plan, or one whose planned bytes are still held by a
buffer that lives longer than recorded, goes to the upstream resource instead (counted as a
fallback), so a deviation costs speed, never correctness.
"""

from __future__ import annotations

import bisect
import threading
from typing import Iterable

import numpy as np

from ..errors import InvalidParamError, MemoryFreeError
from ..planning import Plan, plan as make_plan, problem_from_trace
from ..events import TraceEvent
from .resource import MemoryResource

ALIGNMENT = 64            # every planned block starts 64-byte aligned (the carving rule)


def _block(nbytes: int) -> int:
    """Arena bytes of a request: ALIGN_UP(n, 32) + 32 (CANN's rule), then to 64 for alignment."""
    carved = -(-max(nbytes, 1) // 32) * 32 + 32
    return -(-carved // ALIGNMENT) * ALIGNMENT


class StaticPlan(MemoryResource):
    """A MemoryResource that serves planned requests from one arena taken from `upstream`."""

    def __init__(self, plan: Plan, requested: Iterable[int], upstream: MemoryResource, stream=None):
        requested = np.asarray(list(requested), dtype=np.int64)
        order = np.argsort(plan.problem.lower, kind="stable")    # buffers in allocation order
        if len(requested) != len(order):
            raise InvalidParamError(f"StaticPlan: {len(requested)} request sizes for a plan of "
                                    f"{len(order)} buffers")
        if np.any(plan.offsets % ALIGNMENT) or np.any(plan.problem.size % ALIGNMENT):
            raise InvalidParamError(f"StaticPlan: plan offsets and sizes must be multiples of "
                                    f"{ALIGNMENT}; build it with StaticPlan.from_trace")
        self._upstream = upstream
        self.plan = plan
        self._offsets = plan.offsets[order].tolist()
        self._sizes = plan.problem.size[order].tolist()
        self._requested = requested.tolist()
        self.arena_bytes = max(plan.height, ALIGNMENT)
        self.base = upstream.allocate(self.arena_bytes, stream)
        self._lock = threading.Lock()
        self._next = 0
        self._live: list[tuple[int, int]] = []          # (offset, end) of live planned blocks
        self._planned: dict[int, tuple[int, int]] = {}  # pointer -> (offset, end)
        self._fallback: set[int] = set()                # pointers served by upstream
        self.planned_allocs = self.fallback_allocs = self.steps = 0

    @classmethod
    def from_trace(cls, events: Iterable[TraceEvent], upstream: MemoryResource,
                   algorithm: str = "search", time_limit: float = 10.0, stream=None) -> "StaticPlan":
        """Plan the recorded step `events` (allocations and frees in order) and take its arena."""
        events = list(events)
        requested, live = [], set()
        for number, event in enumerate(events):
            if event.action == "alloc":
                if event.addr in live:
                    raise InvalidParamError(f"StaticPlan: address {event.addr:#x} allocated twice "
                                            f"without a free (event {number})")
                live.add(event.addr)
                requested.append(event.size)
            else:
                live.discard(event.addr)
        problem = problem_from_trace(events, "recorded step", size_of=_block)
        return cls(make_plan(problem, algorithm, time_limit), requested, upstream, stream)

    @property
    def upstream(self) -> MemoryResource:
        return self._upstream

    def begin_step(self) -> None:
        """Start the recorded sequence again (call at the top of every step)."""
        with self._lock:
            self._next = 0
            self.steps += 1

    def allocate(self, nbytes: int, stream=None) -> int:
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise InvalidParamError(f"StaticPlan: size must be a non-negative integer, got {nbytes!r}")
        with self._lock:
            k = self._next
            if k < len(self._offsets) and self._requested[k] == nbytes:
                offset, end = self._offsets[k], self._offsets[k] + self._sizes[k]
                at = bisect.bisect_left(self._live, (offset, end))
                clear = (at == 0 or self._live[at - 1][1] <= offset) and \
                    (at == len(self._live) or self._live[at][0] >= end)
                if clear:
                    self._next += 1
                    self._live.insert(at, (offset, end))
                    pointer = self.base + offset
                    self._planned[pointer] = (offset, end)
                    self.planned_allocs += 1
                    return pointer
            self._next += 1
        pointer = self._upstream.allocate(nbytes, stream)
        with self._lock:
            self._fallback.add(pointer)
            self.fallback_allocs += 1
        return pointer

    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        with self._lock:
            block = self._planned.pop(pointer, None)
            if block is not None:
                del self._live[bisect.bisect_left(self._live, block)]
                return
            if pointer not in self._fallback:
                raise MemoryFreeError(f"StaticPlan: {pointer:#x} was not allocated here (or was "
                                      "already freed)")
            self._fallback.remove(pointer)
        self._upstream.deallocate(pointer, nbytes, stream)

    def owns(self, pointer: int) -> bool:
        with self._lock:
            return pointer in self._planned or pointer in self._fallback

    def stats(self) -> dict:
        with self._lock:
            return {"arena_bytes": self.arena_bytes, "planned_allocs": self.planned_allocs,
                    "fallback_allocs": self.fallback_allocs, "steps": self.steps,
                    "live_planned": len(self._planned), "live_fallback": len(self._fallback)}

    def close(self) -> None:
        """Give the arena back; every planned block must have been freed."""
        with self._lock:
            if self._planned:
                raise InvalidParamError(f"StaticPlan: {len(self._planned)} planned block(s) still "
                                        "allocated; free them before close()")
        self._upstream.deallocate(self.base, self.arena_bytes)
