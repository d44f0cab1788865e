"""RAPIDS RMM's logging_resource_adaptor CSV: `Thread,Time,Action,Pointer,Size,Stream`.

Actions `allocate`, `free` and `allocate failure` (skipped: nothing was allocated). Time is a
wall-clock `HH:MM:SS.ffffff` (RMM's and npumem's LoggingAdaptor) or a number of microseconds;
pointers and streams are hex (`0x...`) or decimal.
"""

from __future__ import annotations

import csv
import datetime
from typing import Iterable, Iterator

from .events import TraceEvent, TraceFormatError
from .textio import csv_records, open_for_writing

HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
DAY_US = 86_400_000_000


def sniff(head: bytes) -> bool:
    return head.lstrip().replace(b" ", b"").startswith(b"Thread,Time,Action")


def _clock_us(text: str) -> float:
    text = text.strip()
    if ":" not in text:
        return float(text)
    hours, minutes, rest = text.split(":", 2)
    seconds = float(rest.replace(":", ".", 1))
    return ((int(hours) * 60 + int(minutes)) * 60 + seconds) * 1e6


def read(path: str) -> Iterator[TraceEvent]:
    origin, previous, wraps = None, 0.0, 0
    for where, row, column in csv_records(path, HEADER, "an RMM log"):
        action = row[column["Action"]].strip()
        if action == "allocate failure":
            continue
        if action not in ("allocate", "free"):
            raise TraceFormatError(path, where, f"action must be allocate, free or allocate "
                                   f"failure, got {action!r}")
        try:
            clock = _clock_us(row[column["Time"]])
            pointer = int(row[column["Pointer"]], 0)
            size = int(row[column["Size"]])
            stream = int(row[column["Stream"]] or "0", 0)
        except (ValueError, IndexError) as exc:
            raise TraceFormatError(path, where, f"bad field ({exc}); expected "
                                   f"{','.join(HEADER)}") from None
        if origin is None:
            origin = clock
        if clock + wraps < previous - DAY_US / 2:     # the log ran past midnight
            wraps += DAY_US
        previous = clock + wraps
        yield TraceEvent(previous - origin, "alloc" if action == "allocate" else "free",
                         pointer, size, stream)


def write(events: Iterable[TraceEvent], path: str) -> int:
    count = 0
    with open_for_writing(path) as out:
        writer = csv.writer(out)
        writer.writerow(HEADER)
        for event in events:
            clock = datetime.timedelta(microseconds=event.t_us)
            hours, rem = divmod(clock.seconds + clock.days * 86400, 3600)
            stamp = f"{hours:02d}:{rem // 60:02d}:{rem % 60:02d}.{clock.microseconds:06d}"
            writer.writerow((0, stamp, "allocate" if event.action == "alloc" else "free",
                             f"0x{event.addr:x}", event.size, event.stream))
            count += 1
    return count
