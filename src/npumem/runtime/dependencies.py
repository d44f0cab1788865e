"""Who waits for whom between streams, so that a deadlock is refused before anything hangs.

A wait task on stream S blocks S until an event's record runs on stream T. That record runs only
after every task queued on T before it, including T's own waits, so waits form a graph: wait W
depends on the waits queued on T ahead of W's record. Waiting for an event that has no record
yet (npumem follows NPU events here: such a wait lasts until the event's next record) leaves W
unbound until a record arrives. Binding a wait to a record that is itself (transitively) behind
that wait closes a cycle: the streams would wait for each other forever. `GRAPH.cycle` finds that
path and `Event.record` refuses the call with the cycle spelled out, before queueing anything.

Only waits still queued or running are kept; each removes itself when it finishes.
"""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass(eq=False)
class RecordPoint:
    """Where an event's record sits: task number `task` of `stream`; `reached` once it ran."""

    stream: object
    task: int
    reached: threading.Event


@dataclasses.dataclass(eq=False)
class PendingWait:
    """Task number `task` of `stream` waits for `event`; `record` is None until one is queued."""

    stream: object
    task: int
    event: object
    record: RecordPoint | None = None
    cancelled: str = ""            # why the wait was given up (the waiting task then fails)

    @property
    def blocking(self) -> bool:
        return self.record is None or not self.record.reached.is_set()

    def describe(self) -> str:
        where = (f"recorded on {self.record.stream!r} as task #{self.record.task}"
                 if self.record else "which has no record queued yet (it waits for the next one)")
        return f"{self.stream!r} task #{self.task} waits for {self.event!r}, {where}"


@dataclasses.dataclass(frozen=True)
class Dependency:
    """One pending cross-stream edge, for `dependencies()`: `waiter` waits on `recorder`."""

    waiter: object
    wait_task: int
    event: object
    recorder: object | None
    record_task: int | None


class DependencyGraph:
    """The pending waits of every stream. Callers hold `lock` while they check and queue."""

    def __init__(self):
        self.lock = threading.RLock()
        self._waits: dict[object, list[PendingWait]] = {}    # per stream, in task order

    def add(self, wait: PendingWait) -> None:
        self._waits.setdefault(wait.stream, []).append(wait)

    def remove(self, wait: PendingWait) -> None:
        with self.lock:
            waits = self._waits.get(wait.stream)
            if waits is not None and wait in waits:
                waits.remove(wait)
                if not waits:
                    del self._waits[wait.stream]

    def cancel(self, waits: list[PendingWait], reason: str) -> None:
        """Give up `waits`: each waiting task stops waiting and fails with `reason`."""
        for wait in waits:
            wait.cancelled = reason

    def unbound(self, event) -> list[PendingWait]:
        return [w for waits in self._waits.values() for w in waits
                if w.event is event and w.record is None]

    def waits_on(self, stream) -> list[PendingWait]:
        return [w for w in self._waits.get(stream, ()) if w.blocking]

    def cycle(self, wait: PendingWait, record: RecordPoint) -> list[PendingWait] | None:
        """The waits that would form a cycle if `wait` waited for `record`, or None."""
        path = self._path_back(record, wait, set())
        return None if path is None else [wait, *path]

    def _path_back(self, record: RecordPoint, target: PendingWait, seen: set) -> list | None:
        """Blocking waits from `record` back to `target`: each is queued ahead of the record
        the previous one waits for."""
        for wait in self.waits_on(record.stream):
            if wait.task >= record.task:
                break
            if wait is target:
                return []
            if wait.record is None or id(wait) in seen:
                continue
            seen.add(id(wait))
            rest = self._path_back(wait.record, target, seen)
            if rest is not None:
                return [wait, *rest]
        return None

    def snapshot(self) -> list[Dependency]:
        with self.lock:
            return [Dependency(w.stream, w.task, w.event, w.record and w.record.stream,
                               w.record and w.record.task)
                    for waits in self._waits.values() for w in waits if w.blocking]


def describe_cycle(cycle: list[PendingWait]) -> str:
    streams = [w.stream for w in cycle] + [cycle[0].stream]
    names = " -> ".join(f"0x{s.handle:x}" for s in streams)
    steps = "; ".join(w.describe() for w in cycle)
    return f"streams {names} would wait for each other forever: {steps}"


GRAPH = DependencyGraph()
