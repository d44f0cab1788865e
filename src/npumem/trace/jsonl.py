"""npumem's JSONL trace: one object per line, in time order, streamed both ways.

    {"t_us": 12.5, "action": "alloc"|"free", "addr": 94205676378496, "size": 1048576, "stream": 0}
"""

from __future__ import annotations

import json
from typing import Iterable, Iterator

from .events import TraceEvent, TraceFormatError
from .textio import open_for_writing, reading


def sniff(head: bytes) -> bool:
    first = head.lstrip().split(b"\n", 1)[0]
    return first.startswith(b"{") and b'"action"' in first


def read(path: str) -> Iterator[TraceEvent]:
    with reading(path) as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                yield _event(path, number, line)


def _event(path: str, number: int, line: str) -> TraceEvent:
    where = str(number)
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, where, f"not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise TraceFormatError(path, where, "expected a JSON object per line")
    action = record.get("action")
    if action not in ("alloc", "free"):
        raise TraceFormatError(path, where, f"action must be 'alloc' or 'free', got {action!r}")
    for key in ("addr", "size"):
        value = record.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TraceFormatError(path, where, f"{key} must be a non-negative integer, got {value!r}")
    t_us = record.get("t_us", 0.0)
    stream = record.get("stream", 0)
    if not isinstance(t_us, (int, float)) or not isinstance(stream, int):
        raise TraceFormatError(path, where, "t_us must be a number and stream an integer")
    return TraceEvent(float(t_us), action, record["addr"], record["size"], stream)


def write(events: Iterable[TraceEvent], path: str) -> int:
    count = 0
    with open_for_writing(path) as out:
        for event in events:
            record = {"t_us": event.t_us, "action": event.action, "addr": event.addr,
                      "size": event.size}
            if event.stream:
                record["stream"] = event.stream
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
            count += 1
    return count
