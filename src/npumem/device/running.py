"""Which stream's work runs on the calling thread: a stream's worker thread, or a task a stream
runs inline on the thread that queued it. Runtime streams say so here (they live above the
device layer); the sanitizer asks, to tell ordered reuse of a freed block from a stale use."""

from __future__ import annotations

import threading

_INLINE = threading.local()        # the stream whose task runs inline on this thread, if any


def running_stream():
    """The stream whose work runs on the calling thread (its worker, or a task run inline),
    or None on a plain host thread."""
    stream = getattr(_INLINE, "stream", None)
    return stream if stream is not None else \
        getattr(threading.current_thread(), "npumem_stream", None)


def set_inline(stream):
    """Say that `stream`'s task runs inline on this thread (None: no stream's does); returns
    the stream said before, to be said again when the task ends (a plain function: a
    context manager would cost a small op a microsecond)."""
    outer = getattr(_INLINE, "stream", None)
    _INLINE.stream = stream
    return outer
