"""RAPIDS RMM's logging_resource_adaptor CSV: `Thread,Time,Action,Pointer,Size,Stream`.

Also read: the older five-column log (`Time,Action,Pointer,Size,Stream`, time `HH:MM:SS:us`),
logs printed without a header (spark-rapids' debug output), and RMM's Python log names
(`memory_log.csv.dev0`). Actions `allocate`, `free` and `allocate failure` (skipped: nothing was
allocated). Time is a wall-clock time of day, `HH:MM:SS.ffffff` or `HH:MM:SS:ffffff` (a log
that runs past midnight goes on counting), or a number of microseconds; pointers and streams
are hex (`0x...`) or decimal.
"""

from __future__ import annotations

import csv
import datetime
import math
import re
from typing import Iterable, Iterator

from ..events import TraceEvent
from .file_checks import TraceFormatError, checked_event
from .textio import open_for_writing, reading

HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
REQUIRED = ("Time", "Action", "Pointer", "Size")
DAY_US = 86_400_000_000
_HEADERLESS = re.compile(rb"^\s*\d+,\s*\d{1,2}:\d\d:\d\d[.:]\d+,\s*(allocate|free)")


def sniff(head: bytes) -> bool:
    first = head.lstrip().split(b"\n", 1)[0].replace(b" ", b"")
    return first.startswith((b"Thread,Time,Action", b"Time,Action,Pointer")) or \
        bool(_HEADERLESS.match(head.lstrip()))


def _clock_us(text: str) -> float:
    text = text.strip()
    if ":" not in text:
        return float(text)
    hours, minutes, rest = text.split(":", 2)
    seconds = float(rest.replace(":", ".", 1))
    return ((int(hours) * 60 + int(minutes)) * 60 + seconds) * 1e6


def _records(path: str):
    """(line number, row, column index by name); a log without a header has RMM's columns."""
    with reading(path) as handle:
        reader = csv.reader(handle)
        first = [cell.strip() for cell in next(reader, [])]
        if "Action" in first:
            missing = [name for name in REQUIRED if name not in first]
            if missing:
                raise TraceFormatError(path, "1", f"not an RMM log: missing {missing}")
            column = {name: index for index, name in enumerate(first)}
        else:
            column = {name: index for index, name in enumerate(HEADER)}
            if first:
                yield "1", first, column
        for row in reader:
            if row:
                yield str(reader.line_num), row, column


def read(path: str) -> Iterator[TraceEvent]:
    origin, previous, wraps = None, 0.0, 0
    for where, row, column in _records(path):
        action = row[column["Action"]].strip() if column["Action"] < len(row) else ""
        if action == "allocate failure":
            continue
        if action not in ("allocate", "free"):
            raise TraceFormatError(path, where, f"action must be allocate, free or allocate "
                                   f"failure, got {action!r}")
        try:
            clock = _clock_us(row[column["Time"]])
            pointer = int(row[column["Pointer"]].strip(), 0)
            size = int(row[column["Size"]])
            stream = int(row[column["Stream"]].strip() or "0", 0) \
                if "Stream" in column and column["Stream"] < len(row) else 0
        except (ValueError, IndexError, OverflowError) as exc:
            raise TraceFormatError(path, where, f"bad field ({str(exc):.80}); expected "
                                   f"{','.join(HEADER)}") from None
        if not math.isfinite(clock):
            raise TraceFormatError(path, where, f"the time must be finite, got "
                                   f"{row[column['Time']]!r:.40}")
        if origin is None:
            origin = clock
        if clock + wraps < previous - DAY_US / 2:     # the log ran past midnight
            wraps += DAY_US
        previous = clock + wraps
        yield checked_event(path, where, previous - origin,
                            "alloc" if action == "allocate" else "free", pointer, size, stream)


def write(events: Iterable[TraceEvent], path: str) -> int:
    count = 0
    with open_for_writing(path) as out:
        writer = csv.writer(out)
        writer.writerow(HEADER)
        for event in events:            # a time of day, as RMM writes (the reader unwraps days)
            clock = datetime.timedelta(microseconds=event.t_us % DAY_US)
            hours, rem = divmod(clock.seconds, 3600)
            stamp = f"{hours:02d}:{rem // 60:02d}:{rem % 60:02d}.{clock.microseconds:06d}"
            writer.writerow((0, stamp, "allocate" if event.action == "alloc" else "free",
                             f"0x{event.addr:x}", event.size, event.stream))
            count += 1
    return count
