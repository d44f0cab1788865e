"""msprof / torch_npu profiler `operator_memory.csv`: one row per allocation, with the time it was
allocated and released (REFERENCE.md section 5).

The rows carry no address, so the reader numbers them; an empty release time means the memory
was still allocated at the end. Rows are gathered and turned into time-ordered events (a free
before an allocation at the same microsecond).
"""

from __future__ import annotations

import csv
from typing import Iterable, Iterator

from .events import TraceEvent, TraceFormatError
from .textio import csv_records, open_for_writing

OPERATOR_MEMORY_COLUMNS = (
    "Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)",
    "Duration(us)", "Active Duration(us)", "Allocation Total Allocated(MB)",
    "Allocation Total Reserved(MB)", "Allocation Total Active(MB)", "Release Total Allocated(MB)",
    "Release Total Reserved(MB)", "Release Total Active(MB)", "Stream Ptr", "Device Type")
REQUIRED = ("Size(KB)", "Allocation Time(us)", "Release Time(us)")


def sniff(head: bytes) -> bool:
    first = head.lstrip().split(b"\n", 1)[0]
    return b"Allocation Time(us)" in first and b"Size(KB)" in first


def _stream(text: str) -> int:
    try:
        return int(text, 0) if text else 0
    except ValueError:
        return 0


def read(path: str) -> Iterator[TraceEvent]:
    rows = []                     # (time, 0 for free / 1 for alloc, row number, size, stream)
    for where, row, column in csv_records(path, REQUIRED, "an operator_memory.csv"):
        size_at, alloc_at, release_at = (column[name] for name in REQUIRED)
        try:
            size = round(float(row[size_at]) * 1024)
            start = float(row[alloc_at])
            end = float(row[release_at]) if row[release_at].strip() else None
        except (ValueError, IndexError):
            raise TraceFormatError(path, where, "Size(KB), Allocation Time(us) and Release "
                                   "Time(us) must be numbers") from None
        if size < 0 or (end is not None and end < start):
            raise TraceFormatError(path, where, f"negative size or release before allocation "
                                   f"(size {size} B, {start} -> {end} us)")
        stream = _stream(row[column["Stream Ptr"]].strip()) if "Stream Ptr" in column else 0
        number = int(where)
        rows.append((start, 1, number, size, stream))
        if end is not None:
            rows.append((end, 0, number, size, stream))
    rows.sort()
    for when, is_alloc, number, size, stream in rows:
        yield TraceEvent(when, "alloc" if is_alloc else "free", number, size, stream)


def write(events: Iterable[TraceEvent], path: str) -> int:
    """One row per allocation; totals are the running sum of requested bytes (a trace knows
    nothing about reserved memory, so the reserved and active columns repeat it)."""
    rows: list[list] = []
    open_rows: dict[int, list] = {}
    allocated = 0
    for event in events:
        if event.action == "alloc":
            allocated += event.size
            mb = round(allocated / 2**20, 6)
            row = ["trace", round(event.size / 1024, 3), event.t_us, "", "", "", "", mb, mb, mb,
                   "", "", "", event.stream, "NPU:0"]
            open_rows[event.addr] = row
            rows.append(row)
        else:
            row = open_rows.pop(event.addr, None)
            if row is None:
                continue
            allocated -= event.size
            mb = round(allocated / 2**20, 6)
            duration = round(event.t_us - row[2], 3)
            row[3:7] = [event.t_us, event.t_us, duration, duration]
            row[10:13] = [mb, mb, mb]
    with open_for_writing(path) as out:
        writer = csv.writer(out)
        writer.writerow(OPERATOR_MEMORY_COLUMNS)
        writer.writerows(rows)
    return len(rows)
