"""Writing a snapshot whose traces are columns (`columns.Entries`) as the pickle PyTorch writes,
a chunk of entries at a time: ten million entries never become ten million dicts at once.

One pickler writes everything, so its memo numbers every shared object once:
1. the objects entries share (stacks, action names, keys, extra fields), memoized as one list
   that the unpickler drops again (POP) before the snapshot begins;
2. the snapshot with empty device lists, `device_traces` last. Its device lists are then the
   last lists it makes, and nothing after them refers back by memo number, so entries can go
   right after each list is made;
3. each device's entries, a chunk at a time, in the pickler's fast mode: shared objects are
   still found in its memo, and entries themselves are not memoized (the memo would keep every
   one alive).
"""

from __future__ import annotations

import io
import pickle
import pickletools
from collections import deque

from .columns import _CHUNK, ACTIONS, Entries

_PROTOCOL = 2                   # no framing: the pieces are spliced without frame lengths
_ENTRY_KEYS = ("action", "addr", "size", "stream", "time_us", "requested_size", "frames")


def streams(data: dict) -> bool:
    """Whether `data`'s traces are columns, which `dump` writes a chunk at a time."""
    traces = data.get("device_traces")
    return isinstance(traces, list) and bool(traces) and all(
        isinstance(trace, Entries) for trace in traces)


class _Sink:
    """The pickler's file (it keeps the file's write method): writes to a buffer per piece."""

    def __init__(self):
        self.buffer = io.BytesIO()

    def write(self, data) -> int:
        return self.buffer.write(data)


def dump(data: dict, out) -> int:
    """Pickle `data` (its traces columns: `streams`) to the binary file `out`; the number of
    trace entries written."""
    traces = data["device_traces"]
    head = {key: value for key, value in data.items() if key != "device_traces"}
    head["device_traces"] = [[] for _ in traces]
    sink = _Sink()
    pickler = pickle.Pickler(sink, protocol=_PROTOCOL)
    tables = {id(trace.columns.tables): trace.columns.tables for trace in traces}
    shared = _dumped(pickler, sink, [part for t in tables.values() for part in _shared_objects(t)])
    made = _dumped(pickler, sink, head)
    cuts = _after_device_lists(made, len(traces))
    out.write(shared[:-1] + b"0")                       # PROTO, the shared objects, POP
    pickler.fast = True
    written, done = 0, 2                                # (made's own PROTO is left out)
    for trace, cut in zip(traces, cuts):
        out.write(made[done:cut])
        done = cut
        for start in range(0, len(trace), _CHUNK):
            chunk = list(trace[start:start + _CHUNK])
            out.write(_chunk_items(_dumped(pickler, sink, chunk)))
            written += len(chunk)
    out.write(made[done:])
    return written


def _dumped(pickler, sink, value) -> bytes:
    sink.buffer = io.BytesIO()
    pickler.dump(value)
    return sink.buffer.getvalue()


def _chunk_items(pickled: bytes) -> bytes:
    """A fast-mode chunk's ops without PROTO, the chunk's own list and STOP: its items are
    appended to the device list made just before."""
    assert pickled[:3] == bytes([pickle.PROTO[0], _PROTOCOL]) + pickle.EMPTY_LIST \
        and pickled[-1:] == pickle.STOP, pickled[:8]
    return pickled[3:-1]


def _shared_objects(tables) -> list:
    """What entries of these tables share: memoized once, then found in the memo."""
    extras = [part for fields in tables.extra_dicts for item in fields.items() for part in item]
    return [*_ENTRY_KEYS, *ACTIONS, *tables.stacks, *extras]


def _after_device_lists(made: bytes, count: int) -> list[int]:
    """Where each of the last `count` lists made ends (after its memo op): the device lists."""
    cuts: deque[int] = deque(maxlen=count)
    before = after = None                   # the two ops before this one
    for op, _, at in pickletools.genops(made):
        if before == "EMPTY_LIST" and after in ("BINPUT", "LONG_BINPUT"):
            cuts.append(at)
        before, after = after, op.name
    assert len(cuts) == count, (len(cuts), count)
    return list(cuts)
