"""Streams that really run asynchronously, and events that order and time them.

A stream is a FIFO of tasks served by one worker thread. Enqueueing returns at once; work runs in
order on the worker. A task that fails does not stop the stream: the first failure is kept and
raised (as AsyncTaskError carrying the original ACL code) by the next `synchronize`, the way an
accelerator reports asynchronous errors.

Cross-stream waits go through `dependencies.GRAPH`: a record that would close a cycle of waits
is refused (StreamDeadlockError) instead of letting the streams hang. (A wait never closes one by
itself: it either uses a record already queued or waits for a later one.)
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Callable

from ..errors import (
    AclError, AsyncTaskError, InvalidHandleError, InvalidParamError, KernelFault,
    StreamDeadlockError, StreamNotCompleteError,
)
from ..device.running import set_inline
from .dependencies import GRAPH, PendingWait, RecordPoint, describe_cycle
from .handles import forget, new_handle

Task = Callable[[], None]

def device_work(task: Task, on_skip: Callable[[], None] | None = None) -> Task:
    """Mark `task` as device work (a kernel, an op): a stream stopped by a kernel fault skips
    it (calling `on_skip`) until synchronize reports the fault. Event records and waits still
    run, so other streams waiting on this one are not left hanging."""
    task.device_work = True
    task.on_skip = on_skip
    return task


def _call(task: Task) -> None:
    task()


class _Defaults:
    """What streams and events use when given no context or stream: the runtime's (state.py
    fills these in; it imports this module, so this one cannot import it)."""

    context_for_new_stream: Callable = None      # device or None -> Context
    current_stream: Callable = None              # () -> Stream


DEFAULTS = _Defaults()


class WaitSettings:
    """aclrtSetOpWaitTimeout: how long a queued event wait may block (None: forever)."""

    op_wait_timeout: float | None = None


class Stream:
    """An ordered queue of device work with its own worker thread.

    `npumem.Stream()` makes a new stream on the current device (or `device`), as
    `torch.cuda.Stream()` does, starting the runtime on first use; `priority` is accepted for
    torch's signature and has no effect. The runtime passes `context` for the streams it makes.
    """

    def __init__(self, device: int | None = None, priority: int = 0, *, context=None,
                 is_default: bool = False, runner: Callable[[Task], None] | None = None):
        made_by_user = context is None
        if made_by_user:
            context = DEFAULTS.context_for_new_stream(device)
            device, runner = context.device, context.backend.stream_runner(context.device)
        self.handle = new_handle(self)
        self.priority = priority           # what create_stream_with_config was given (no effect)
        self.flags = 0                     # ACL_STREAM_* flags it was created with
        self._run_task = runner or _call   # the backend's way to run a task on a device stream
        self.device = device
        self.context = context
        self.is_default = is_default
        self.destroyed = False
        self._tasks: queue.SimpleQueue[tuple[Task, str] | None] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._waiting = 0                  # threads in drain: _finished wakes them, if any
        self._submitted = 0
        self._completed = 0
        self._labels: collections.deque[str] = collections.deque()   # queued, for messages
        self._error: BaseException | None = None
        self._stopped_by: BaseException | None = None    # a kernel fault: device work skipped
        self._skipped = 0
        self._running = threading.Lock()   # held while a task runs, on the worker or inline
        self._worker = threading.Thread(
            target=self._run, name=f"npumem-stream-0x{self.handle:x}", daemon=True
        )
        self._worker.npumem_stream = self      # which stream the work on this thread is for
        self._worker.start()
        if made_by_user:                       # reset_device finishes and stops it
            context.streams.append(self)

    def __repr__(self) -> str:
        kind = "default stream" if self.is_default else "stream"
        return f"<npumem {kind} 0x{self.handle:x} on device {self.device}>"

    def enqueue(self, task: Task, label: str) -> int:
        """Queue `task` to run after everything already queued; returns its task number."""
        self.check_alive()
        with self._done:
            number = self._count(label)
        self._tasks.put((task, label))
        return number

    def submit(self, task: Task, label: str) -> None:
        """Run `task` after everything queued before it, as `enqueue` does, but on the calling
        thread at once when the stream is idle (`run_if_idle`). That spares a small op the two
        thread hand-offs a queued task costs."""
        self.check_alive()
        if not self.run_if_idle(task, label):
            self.enqueue(task, label)

    def run_if_idle(self, task: Task, label) -> bool:
        """Run `task` on the calling thread at once when the stream is idle: nothing queued or
        running and no error waiting for synchronize; False, with nothing done, when it is
        not. Work queued meanwhile from another thread waits for it, so stream order stays
        exact. `label` (str() of it) names the task in errors."""
        with self._done:
            if not (self._completed == self._submitted and self._error is None
                    and self._running.acquire(blocking=False)):
                return False
            self._count(label)
        outer = set_inline(self)
        try:
            self._execute(task, label)
        finally:
            set_inline(outer)
            self._running.release()
            self._finished()
        return True

    def _count(self, label: str) -> int:
        """Number a new task (under self._done)."""
        self._submitted += 1
        self._labels.append(label)
        return self._submitted

    @property
    def next_task(self) -> int:
        """The number the next queued task will get."""
        return self._submitted + 1

    def _run(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            task, label = item
            # Drop the task before reporting it done: what it captured (tensors, buffers) must
            # be releasable once synchronize returns, not when the next task arrives.
            item = None
            with self._running:
                self._execute(task, label)
            task = None
            self._finished()

    def _execute(self, task: Task, label: str) -> None:
        if self._stopped_by is not None and getattr(task, "device_work", False):
            self._skipped += 1
            if task.on_skip is not None:
                task.on_skip()
            return
        try:
            self._run_task(task)
        except BaseException as exc:  # noqa: BLE001 - reported at synchronize
            if isinstance(exc, KernelFault) and self._stopped_by is None:
                self._stopped_by = exc
            if self._error is None:
                self._error = _as_acl_error(exc, label, self)

    def _finished(self) -> None:
        with self._done:
            self._labels.popleft()
            self._completed += 1
            if self._completed == self._submitted and self._waiting:
                self._done.notify_all()

    # torch.cuda.Stream's methods

    def wait_event(self, event: "Event") -> None:
        """Work queued on this stream from now on waits for `event`'s latest record."""
        event.make_wait(self)

    def wait_stream(self, stream: "Stream") -> None:
        """Work queued on this stream from now on waits for what `stream` has queued so far."""
        event = Event()
        event.record(stream)
        event.make_wait(self)
        event.destroy()              # the wait is bound to the record already queued

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        """True when every queued task has finished."""
        with self._done:
            return self._completed == self._submitted

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for the work queued so far, leaving its errors for `synchronize`; True if done."""
        with self._done:
            target = self._submitted
            self._waiting += 1
            try:
                return self._done.wait_for(lambda: self._completed >= target, timeout)
            finally:
                self._waiting -= 1

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until the stream is idle; raise the first error its work hit since the last sync."""
        self.check_alive()
        timeout = check_timeout(timeout, "synchronize_stream")
        if not self.drain(timeout):
            raise StreamNotCompleteError(f"{self!r} did not finish within {timeout} s: "
                                         f"{self.describe_pending()}")
        error, self._error = self._error, None
        if self._stopped_by is not None:
            skipped, self._stopped_by, self._skipped = self._skipped, None, 0
            if skipped:
                stopped = AsyncTaskError(f"{error.message}; the stream stopped there, as after a "
                                         f"device fault: {skipped} later task(s) were skipped",
                                         error.code)
                stopped.__cause__, error = error.__cause__, stopped
        if error is not None:
            raise error

    def describe_pending(self) -> str:
        """What is still queued, and what the stream is blocked on, for error messages."""
        with self._done:
            labels, first = list(self._labels), self._completed + 1
        if not labels:
            return "nothing is queued"
        shown = ", ".join(f"#{first + i} {label}" for i, label in enumerate(labels[:5]))
        more = f" and {len(labels) - 5} more" if len(labels) > 5 else ""
        text = f"{len(labels)} task(s) pending ({shown}{more})"
        with GRAPH.lock:
            waits = GRAPH.waits_on(self)
        if waits:
            running = "running" if waits[0].task == first else "queued"
            text += f"; {running}: {waits[0].describe()}"
        return text

    def destroy(self) -> None:
        """Finish queued work, then stop the worker. Errors still pending are raised. Waits for
        events that have no record queued can never end: they fail instead of hanging."""
        self.release_unrecorded_waits(f"{self!r} was destroyed")
        try:
            self.synchronize()
        finally:
            self.destroyed = True
            self._tasks.put(None)
            forget(self.handle)

    def check_alive(self) -> None:
        if self.destroyed:
            raise InvalidHandleError(f"stream 0x{self.handle:x} was destroyed")

    def release_unrecorded_waits(self, why: str) -> None:
        """Give up this stream's waits for events with no record queued (teardown)."""
        with GRAPH.lock:
            GRAPH.cancel([w for w in GRAPH.waits_on(self) if w.record is None],
                         f"{why} while it waited for an event that was never recorded")


_POLL = 0.05          # how often a blocked wait looks whether it was given up (seconds)


def check_timeout(timeout, what: str) -> float | None:
    """None (wait as long as it takes) or a number of seconds, 0 or more."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not 0 <= timeout < float("inf"):
        raise InvalidParamError(f"{what}: timeout must be None or seconds (0 or more), got "
                                f"{timeout!r}")
    return float(timeout)


def _as_acl_error(exc: BaseException, label: str, stream: Stream) -> AclError:
    code = exc.code if isinstance(exc, AclError) else None
    detail = exc.message if isinstance(exc, AclError) else f"{type(exc).__name__}: {exc}"
    error = AsyncTaskError(f"{label} queued on {stream!r} failed: {detail}", code)
    error.__cause__ = exc
    return error


def _current(stream: "Stream | None") -> "Stream":
    return stream if stream is not None else DEFAULTS.current_stream()


class Event:
    """A marker in a stream: record it, wait for it, time between two of them.

    A wait uses the event's latest record. A wait for an event that has no record (never
    recorded, or reset since) lasts until its next record, as on an NPU, which is what lets a
    program queue a wait before the record it needs, and what can deadlock; see dependencies.

    torch's constructor arguments are accepted: every npumem event keeps a time stamp
    (`enable_timing`), and `blocking` / `interprocess` change nothing here.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        self.enable_timing = enable_timing
        self.flags = 0                     # ACL_EVENT_* flags from create_event_with_flag
        self.handle = new_handle(self)
        self.destroyed = False
        self._reached: threading.Event | None = None     # None: no record since create/reset
        self._next: threading.Event | None = None         # what waits queued before a record use
        self._record: RecordPoint | None = None
        self.timestamp: float | None = None

    def __repr__(self) -> str:
        return f"<npumem event 0x{self.handle:x}>"

    def check_alive(self) -> None:
        if self.destroyed:
            raise InvalidHandleError(f"event 0x{self.handle:x} was destroyed")

    def record(self, stream: Stream | None = None) -> None:
        """Mark the point in `stream` (default: the current stream) after all work queued so
        far."""
        stream = _current(stream)
        self.check_alive()
        stream.check_alive()
        with GRAPH.lock:
            reached = self._next or threading.Event()
            point = RecordPoint(stream, stream.next_task, reached)
            waiting = GRAPH.unbound(self)
            for wait in waiting:       # bind all first: one may close a cycle through another
                wait.record = point
            for wait in waiting:
                cycle = GRAPH.cycle(wait, point)
                if cycle:
                    message = (f"record_event({self!r}, {stream!r}) refused, nothing was queued: "
                               f"{describe_cycle(cycle)}. Record the event before queueing the "
                               "waits that it must release, or put the work on one stream")
                    for bound in waiting:
                        bound.record = None
                    raise StreamDeadlockError(message)

            def mark() -> None:
                self.timestamp = time.perf_counter()
                reached.set()

            self._reached, self._next, self._record, self.timestamp = reached, None, point, None
            point.task = stream.enqueue(mark, f"record {self!r}")

    def destroy(self) -> None:
        """Destroy the event. Waits bound to a record already queued still end when it runs
        (as cudaEventDestroy lets them); waits for a record that was never queued could never
        end, and fail."""
        self.check_alive()
        with GRAPH.lock:
            GRAPH.cancel(GRAPH.unbound(self), f"{self!r} was destroyed before it was recorded")
        self.destroyed = True
        forget(self.handle)

    def reset(self) -> None:
        self.check_alive()
        with GRAPH.lock:
            self._reached, self._record, self.timestamp = None, None, None

    @property
    def recorded(self) -> bool:
        """Whether the event has a record (queued or reached) since it was created or reset."""
        return self._reached is not None

    def query(self) -> bool:
        """True when the last recorded point was reached (or the event was never recorded)."""
        self.check_alive()
        return self._reached is None or self._reached.is_set()

    def synchronize(self, timeout: float | None = None) -> None:
        self.check_alive()
        timeout = check_timeout(timeout, "synchronize_event")
        reached = self._reached
        if reached is not None and not reached.wait(timeout):
            record = self._record
            where = (f"; its record is task #{record.task} of {record.stream!r}: "
                     f"{record.stream.describe_pending()}") if record else ""
            raise StreamNotCompleteError(f"{self!r} was not reached within {timeout} s{where}")

    def make_wait(self, stream: Stream) -> None:
        """Make future work on `stream` wait until this event's latest record is reached, or,
        with no record yet, its next one."""
        self.check_alive()
        stream.check_alive()
        with GRAPH.lock:
            if self._reached is not None and self._reached.is_set():
                return                                  # already reached: nothing to wait for
            if self._reached is None:
                self._next = reached = self._next or threading.Event()
            else:
                reached = self._reached
            wait = PendingWait(stream, stream.next_task, self, self._record)
            label = f"wait for {self!r}"
            limit = WaitSettings.op_wait_timeout      # the setting when the wait was queued

            def block() -> None:
                deadline = None if limit is None else time.monotonic() + limit
                try:
                    while not reached.wait(_POLL if deadline is None else
                                           max(0.0, min(_POLL, deadline - time.monotonic()))):
                        if wait.cancelled:         # destroy_event or teardown gave it up
                            raise StreamNotCompleteError(f"{label} on {stream!r} was given up: "
                                                         f"{wait.cancelled}")
                        if deadline is not None and time.monotonic() >= deadline:
                            raise StreamNotCompleteError(
                                f"{label} on {stream!r} timed out after {limit} s (op wait "
                                f"timeout); {wait.describe()}")
                finally:
                    GRAPH.remove(wait)

            wait.task = stream.enqueue(block, label)
            GRAPH.add(wait)

    # torch.cuda.Event's methods; a missing stream means the current stream (lazy init).

    def wait(self, stream: "Stream | None" = None) -> None:
        """Make `stream` (default: the current stream) wait for this event's latest record."""
        self.make_wait(_current(stream))

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event to `end` (torch's name for elapsed_ms)."""
        return self.elapsed_ms(end)

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end`; both must be recorded and reached."""
        for event in (self, end):
            event.check_alive()
            if event._reached is None:
                raise StreamNotCompleteError(f"{event!r} was never recorded")
            if event.timestamp is None:
                raise StreamNotCompleteError(f"{event!r} has not been reached yet")
        return (end.timestamp - self.timestamp) * 1000.0
