"""Host callbacks in stream order (aclrtLaunchCallback) and the threads that run them.

A thread subscribes to a stream (`subscribe_report(thread_id, stream)`); `launch_callback`
queues a task on the stream that, when the stream reaches it, hands the callback to that
thread, which runs it inside its next `process_report(timeout)`. A blocking callback holds the
stream until it has run; the wait gives up, with an error on the stream, if the subscription
goes away (unsubscribe, destroy_stream, finalize), so teardown never hangs.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from ..errors import (
    ACL_ERROR_REPEAT_SUBSCRIBE, ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_RT_STREAM_NO_CB_REG,
    ACL_ERROR_RT_THREAD_SUBSCRIBE, ACL_ERROR_STREAM_NOT_SUBSCRIBE, AclError, InvalidParamError,
    integer_argument,
)
from .state import RUNTIME

CALLBACK_NO_BLOCK, CALLBACK_BLOCK = 0, 1


class CallbackError(AclError):
    """A subscription or callback call that cannot be done (the code says which)."""


@dataclass
class _Report:
    function: object
    user_data: object
    done: threading.Event = field(default_factory=threading.Event)


class _Subscriptions:
    def __init__(self):
        self.lock = threading.Lock()
        self.thread_of: dict[object, int] = {}          # stream -> subscribed thread id
        self.reports: dict[int, queue.SimpleQueue] = {}  # thread id -> callbacks to run

    def subscribe(self, thread_id, stream) -> None:
        thread_id = integer_argument(thread_id, "subscribe_report: thread_id")
        with self.lock:
            if stream in self.thread_of:
                raise CallbackError(f"subscribe_report: {stream!r} is already subscribed by "
                                    f"thread {self.thread_of[stream]}", ACL_ERROR_REPEAT_SUBSCRIBE)
            self.thread_of[stream] = thread_id
            self.reports.setdefault(thread_id, queue.SimpleQueue())

    def unsubscribe(self, thread_id, stream) -> None:
        thread_id = integer_argument(thread_id, "unsubscribe_report: thread_id")
        with self.lock:
            if self.thread_of.get(stream) != thread_id:
                raise CallbackError(f"unsubscribe_report: {stream!r} is not subscribed by "
                                    f"thread {thread_id}", ACL_ERROR_STREAM_NOT_SUBSCRIBE)
            del self.thread_of[stream]

    def forget_stream(self, stream) -> None:
        with self.lock:
            self.thread_of.pop(stream, None)

    def launch(self, function, user_data, block_type, stream) -> None:
        if not callable(function):
            raise InvalidParamError(f"launch_callback: fn must be callable, got "
                                    f"{type(function).__name__}")
        block = integer_argument(block_type, "launch_callback: block_type")
        if block not in (CALLBACK_NO_BLOCK, CALLBACK_BLOCK):
            raise InvalidParamError(f"launch_callback: block_type must be ACL_CALLBACK_NO_BLOCK "
                                    f"(0) or ACL_CALLBACK_BLOCK (1), got {block}")
        with self.lock:
            thread_id = self.thread_of.get(stream)
        if thread_id is None:
            raise CallbackError(f"launch_callback: no thread is subscribed to {stream!r}; call "
                                "subscribe_report(thread_id, stream) first",
                                ACL_ERROR_RT_STREAM_NO_CB_REG)
        report = _Report(function, user_data)

        def hand_over() -> None:
            with self.lock:
                reports = self.reports.get(self.thread_of.get(stream))
            if reports is None:
                raise CallbackError(f"launch_callback: {stream!r} was unsubscribed before its "
                                    "callback ran", ACL_ERROR_RT_STREAM_NO_CB_REG)
            reports.put(report)
            while block and not report.done.wait(0.05):
                with self.lock:
                    subscribed = stream in self.thread_of
                if not subscribed:
                    raise CallbackError("launch_callback: the stream was unsubscribed while a "
                                        "blocking callback waited to run",
                                        ACL_ERROR_RT_STREAM_NO_CB_REG)
        stream.enqueue(hand_over, f"callback {getattr(function, '__name__', 'fn')}")

    def process(self, timeout_ms) -> None:
        timeout_ms = integer_argument(timeout_ms, "process_report: timeout")
        thread_id = threading.get_ident()
        reports = self._reports_for(thread_id, timeout_ms)
        if reports is None:
            raise CallbackError(f"process_report: this thread ({thread_id}) is subscribed to no "
                                "stream; call subscribe_report(thread_id, stream)",
                                ACL_ERROR_RT_THREAD_SUBSCRIBE)
        try:
            report = reports.get(timeout=None if timeout_ms < 0 else timeout_ms / 1000)
        except queue.Empty:
            raise CallbackError(f"process_report: no callback within {timeout_ms} ms",
                                ACL_ERROR_RT_REPORT_TIMEOUT) from None
        try:
            report.function(report.user_data)
        finally:
            report.done.set()

    def _reports_for(self, thread_id: int, timeout_ms: int):
        """This thread's callback queue, waiting up to the timeout for a subscription (a thread
        often starts its process_report loop before subscribe_report runs: it must not spin)."""
        deadline = time.monotonic() + (timeout_ms / 1000 if timeout_ms >= 0 else 1.0)
        while True:
            with self.lock:
                if thread_id in self.thread_of.values():
                    return self.reports[thread_id]
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))

    def clear(self) -> None:
        with self.lock:
            self.thread_of.clear()
            self.reports.clear()


SUBSCRIPTIONS = _Subscriptions()


def subscribe_report(thread_id: int, stream) -> None:
    """Callbacks launched on `stream` run in thread `thread_id`'s process_report."""
    SUBSCRIPTIONS.subscribe(thread_id, RUNTIME.stream(stream, "subscribe_report"))


def unsubscribe_report(thread_id: int, stream) -> None:
    SUBSCRIPTIONS.unsubscribe(thread_id, RUNTIME.stream(stream, "unsubscribe_report"))


def launch_callback(function, user_data, block_type: int, stream) -> None:
    """Queue `function(user_data)` on `stream`, run by the subscribed thread when the stream
    reaches it; ACL_CALLBACK_BLOCK (1) holds the stream until it has run."""
    SUBSCRIPTIONS.launch(function, user_data, block_type, RUNTIME.stream(stream, "launch_callback"))


def process_report(timeout_ms: int) -> None:
    """In a subscribed thread: run the next callback, waiting up to `timeout_ms` (-1: forever)."""
    SUBSCRIPTIONS.process(timeout_ms)
