"""Streams that really run asynchronously, and events that order and time them.

A stream is a FIFO of tasks served by one worker thread. Enqueueing returns at once; work runs in
order on the worker. A task that fails does not stop the stream: the first failure is kept and
raised (as AsyncTaskError carrying the original ACL code) by the next `synchronize`, the way an
accelerator reports asynchronous errors.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

from ..errors import AclError, AsyncTaskError, InvalidHandleError, StreamNotCompleteError
from .handles import forget, new_handle

Task = Callable[[], None]


class Stream:
    """An ordered queue of device work with its own worker thread."""

    def __init__(self, device: int, context: "object", is_default: bool = False):
        self.handle = new_handle(self)
        self.device = device
        self.context = context
        self.is_default = is_default
        self.destroyed = False
        self._tasks: queue.SimpleQueue[tuple[Task, str] | None] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._submitted = 0
        self._completed = 0
        self._current = ""           # label of the running task, for timeout messages
        self._error: BaseException | None = None
        self._worker = threading.Thread(
            target=self._run, name=f"npumem-stream-0x{self.handle:x}", daemon=True
        )
        self._worker.start()

    def __repr__(self) -> str:
        kind = "default stream" if self.is_default else "stream"
        return f"<npumem {kind} 0x{self.handle:x} on device {self.device}>"

    def enqueue(self, task: Task, label: str) -> None:
        """Queue `task` to run after everything already queued on this stream."""
        self.check_alive()
        with self._done:
            self._submitted += 1
        self._tasks.put((task, label))

    def _run(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            task, label = item
            self._current = label
            try:
                task()
            except BaseException as exc:  # noqa: BLE001 - reported at synchronize
                if self._error is None:
                    self._error = _as_acl_error(exc, label, self)
            finally:
                # Drop the task before reporting it done: what it captured (tensors, buffers)
                # must be releasable once synchronize returns, not when the next task arrives.
                item = task = None
                self._current = ""
                with self._done:
                    self._completed += 1
                    if self._completed == self._submitted:
                        self._done.notify_all()

    def query(self) -> bool:
        """True when every queued task has finished."""
        with self._done:
            return self._completed == self._submitted

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for the work queued so far, leaving its errors for `synchronize`; True if done."""
        with self._done:
            target = self._submitted
            return self._done.wait_for(lambda: self._completed >= target, timeout)

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until the stream is idle; raise the first error its work hit since the last sync."""
        self.check_alive()
        finished = self.drain(timeout)
        with self._done:
            pending = self._submitted - self._completed
        if not finished:
            running = f", running {self._current!r}" if self._current else ""
            raise StreamNotCompleteError(
                f"{self!r} still has {pending} queued task(s) after {timeout} s{running}"
            )
        error, self._error = self._error, None
        if error is not None:
            raise error

    def destroy(self) -> None:
        """Finish queued work, then stop the worker. Errors still pending are raised."""
        try:
            self.synchronize()
        finally:
            self.destroyed = True
            self._tasks.put(None)
            forget(self.handle)

    def check_alive(self) -> None:
        if self.destroyed:
            raise InvalidHandleError(f"stream 0x{self.handle:x} was destroyed")


def _as_acl_error(exc: BaseException, label: str, stream: Stream) -> AclError:
    code = exc.code if isinstance(exc, AclError) else None
    detail = exc.message if isinstance(exc, AclError) else f"{type(exc).__name__}: {exc}"
    error = AsyncTaskError(f"{label} queued on {stream!r} failed: {detail}", code)
    error.__cause__ = exc
    return error


class Event:
    """A marker in a stream: record it, wait for it, time between two of them."""

    def __init__(self):
        self.handle = new_handle(self)
        self.destroyed = False
        self._reached: threading.Event | None = None     # None: never recorded
        self.timestamp: float | None = None

    def __repr__(self) -> str:
        return f"<npumem event 0x{self.handle:x}>"

    def check_alive(self) -> None:
        if self.destroyed:
            raise InvalidHandleError(f"event 0x{self.handle:x} was destroyed")

    def record(self, stream: Stream) -> None:
        """Mark the point in `stream` after all work queued so far."""
        self.check_alive()
        reached = threading.Event()
        self._reached, self.timestamp = reached, None

        def mark() -> None:
            self.timestamp = time.perf_counter()
            reached.set()

        stream.enqueue(mark, f"record {self!r}")

    def destroy(self) -> None:
        self.check_alive()
        self.destroyed = True
        forget(self.handle)

    def reset(self) -> None:
        self.check_alive()
        self._reached, self.timestamp = None, None

    def query(self) -> bool:
        """True when the last recorded point was reached (or the event was never recorded)."""
        self.check_alive()
        return self._reached is None or self._reached.is_set()

    def synchronize(self, timeout: float | None = None) -> None:
        self.check_alive()
        reached = self._reached
        if reached is not None and not reached.wait(timeout):
            raise StreamNotCompleteError(f"{self!r} was not reached within {timeout} s")

    def make_wait(self, stream: Stream) -> None:
        """Make future work on `stream` wait until this event's current record is reached."""
        self.check_alive()
        reached = self._reached
        if reached is not None:
            stream.enqueue(reached.wait, f"wait for {self!r}")

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end`; both must be recorded and reached."""
        for event in (self, end):
            event.check_alive()
            if event._reached is None:
                raise StreamNotCompleteError(f"{event!r} was never recorded")
            if event.timestamp is None:
                raise StreamNotCompleteError(f"{event!r} has not been reached yet")
        return (end.timestamp - self.timestamp) * 1000.0
