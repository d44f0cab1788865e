"""The stream a fake run's work goes to, as torch.cuda keeps it: one current stream per
thread, the default stream (0) until `torch.cuda.stream(s)`, `with s:` or `set_stream(s)`
chooses another. The recorder tags each allocation with it, so that the replay keeps a pool
per stream as c10's allocator does, and cuBLAS takes a workspace per stream
(CublasHandlePool.cpp keys workspaces by handle and stream)."""

from __future__ import annotations

import contextlib
import itertools
import threading

_local = threading.local()
_ids = itertools.count(1)


def current() -> int:
    return getattr(_local, "stream", 0)


def set_current(stream_id: int) -> None:
    _local.stream = stream_id


def new_id() -> int:
    return next(_ids)


@contextlib.contextmanager
def using(stream_id: int | None):
    """The work inside goes to `stream_id` (None: stays where it is), as torch.cuda.stream."""
    if stream_id is None:
        yield
        return
    before = current()
    set_current(stream_id)
    try:
        yield
    finally:
        set_current(before)
