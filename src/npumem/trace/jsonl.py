"""npumem's JSONL trace: one object per line, in time order, streamed both ways.

    {"t_us": 12.5, "action": "alloc"|"free", "addr": 94205676378496, "size": 1048576, "stream": 0}

A JSONL file can also hold a whole memory snapshot, losslessly: a first line
`{"npumem_snapshot": 1, "segments": [...], ...every other top-level key...}`, then each trace
entry as it was (all actions, frames, streams, times) with the device it belongs to:
`{"device": 0, "action": "segment_alloc", "addr": ..., "size": ..., "frames": [...], ...}`.
A stack that several entries share is written once, on a line `{"npumem_stack": 3, "frames":
[...]}` before its first user, and the entries say `"frames": {"npumem_stack": 3}`: a file's
size follows what it holds, not how often it refers to it.
That form is the snapshot package's (trace/snapshot/json_form.py), which reads it like the
pickle, so every command that takes a snapshot takes it.

Lines are parsed into columns by `_jsonl` (C) where it is built; a line not in the form npumem
writes goes to `_event`, the rule of what a line may hold.
"""

from __future__ import annotations

import json
import sys
from typing import Iterable, Iterator

from ..events import TraceEvent
from .file_checks import TraceFormatError, checked_event
from .textio import bounded_reader, decode_json, open_for_writing, reading

try:
    from . import _jsonl
except ImportError:               # a checkout not installed with `pip install -e .`
    _jsonl = None


SNAPSHOT_KEY = "npumem_snapshot"
STACK_KEY = "npumem_stack"


BOM = b"\xef\xbb\xbf"            # what some editors put before a UTF-8 file's first line


def sniff(head: bytes) -> bool:
    """(A trace of events may begin with a BOM; a whole snapshot, which npumem writes, not.)"""
    first = head.removeprefix(BOM).lstrip().split(b"\n", 1)[0]
    return first.startswith(b"{") and (b'"action"' in first or holds_snapshot(head))


def holds_snapshot(head: bytes) -> bool:
    """Whether a JSONL file's first bytes open a whole snapshot (see the module's doc)."""
    return head.lstrip().startswith(b'{"' + SNAPSHOT_KEY.encode() + b'"')


CHUNK = 1 << 16                 # lines parsed at a time while events are streamed
WINDOW = 1 << 22                # bytes of the file read at a time


def read(path: str) -> Iterator[TraceEvent]:
    """The events of a JSONL trace (a file holding a whole snapshot is the snapshot reader's:
    formats.read_trace sends it there), a chunk of lines at a time."""
    from .snapshot import columns

    if not in_columns():
        with reading(path) as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    yield _event(path, number, line)
        return
    for raw in column_chunks(path):
        yield from columns.to_events(columns.from_event_columns(raw))


def in_columns() -> bool:
    """Whether lines are read into columns here (both C extensions are built)."""
    from .snapshot import columns

    return _jsonl is not None and columns.native is not None


def column_chunks(path: str):
    """The trace's columns (`_jsonl.Parser.chunk`'s), CHUNK lines at a time (`in_columns`)."""
    from .snapshot import columns

    return _column_chunks(path, CHUNK, columns.ALLOC, columns.FREE_COMPLETED)


def read_entries(path: str):
    """The whole trace as a snapshot trace's entries (columns: about 33 bytes an event), what
    the model of PyTorch's allocator replays."""
    from .snapshot import columns

    if not in_columns():
        return columns.from_events(read(path))
    raw = next(_column_chunks(path, sys.maxsize, columns.ALLOC, columns.FREE_COMPLETED), None)
    return columns.from_event_columns(raw)


def _column_chunks(path: str, limit: int, alloc_code: int, free_code: int):
    def line_event(number: int, line: bytes) -> TraceEvent | None:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(path, str(number), f"not UTF-8 text: {exc}") from None
        return _event(path, number, text) if text.strip() else None

    with bounded_reader(path, sys.maxsize) as reader:
        parser = _jsonl.Parser(reader, line_event, alloc_code, free_code, WINDOW)
        while (raw := parser.chunk(limit)) is not None:
            yield raw


def _event(path: str, number: int, line: str) -> TraceEvent:
    where = str(number)
    if number == 1:
        line = line.removeprefix("\ufeff")     # a byte-order mark, not part of the object
    record = decode_json(path, where, line)
    if not isinstance(record, dict):
        raise TraceFormatError(path, where, "expected a JSON object per line")
    action = record.get("action")
    if action not in ("alloc", "free"):
        raise TraceFormatError(path, where, f"action must be 'alloc' or 'free', got {action!r:.40}")
    when, stream = record.get("t_us"), record.get("stream")     # (null: not given, as absent)
    return checked_event(path, where, 0.0 if when is None else when, action, record.get("addr"),
                         record.get("size"), 0 if stream is None else stream)


def write(events: Iterable[TraceEvent], path: str) -> int:
    count = 0
    with open_for_writing(path) as out:
        for event in events:
            record = {"t_us": event.t_us, "action": event.action, "addr": event.addr,
                      "size": event.size}
            if event.stream:
                record["stream"] = event.stream
            try:
                out.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
            except ValueError:
                raise TraceFormatError(path, str(count + 1), f"cannot write a time of "
                                       f"{event.t_us!r} us: JSON holds finite numbers only") from None
            count += 1
    return count
