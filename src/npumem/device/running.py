"""Which stream's work runs on the calling thread: a stream's worker thread, or a task a stream
runs inline on the thread that queued it. Runtime streams say so here (they live above the
device layer); the sanitizer asks, to tell ordered reuse of a freed block from a stale use."""

from __future__ import annotations

import threading
from contextlib import contextmanager

_INLINE = threading.local()        # the stream whose task runs inline on this thread, if any


def running_stream():
    """The stream whose work runs on the calling thread (its worker, or a task run inline),
    or None on a plain host thread."""
    stream = getattr(_INLINE, "stream", None)
    return stream if stream is not None else \
        getattr(threading.current_thread(), "npumem_stream", None)


@contextmanager
def running_inline(stream):
    """`stream`'s task runs on this thread meanwhile."""
    outer, _INLINE.stream = getattr(_INLINE, "stream", None), stream
    try:
        yield
    finally:
        _INLINE.stream = outer
