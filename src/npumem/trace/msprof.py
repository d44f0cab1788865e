"""msprof / torch_npu profiler `operator_memory.csv`: one row per allocation, with the time it was
allocated and released (REFERENCE.md section 5).

Two layouts are read: torch_npu's (`Name,Size(KB),Allocation Time(us),Release Time(us),...`) and
msprof's own `operator_memory_*.csv` (`Device_id,Name,Size(KB),Allocation Time(us),Duration(us),
...`), whose release is the allocation time plus the duration. Times may carry a trailing tab.

The rows carry no address, so the reader numbers them. An empty release time (or duration) means
the memory was still allocated at the end. Rows CANN documents as possible are taken for what
they are: a negative size is the release of memory allocated before collection began (a free of
a block the trace never saw allocated, which replays count as such); an empty allocation time
means the time is unknown, and the row is placed at the start of the trace. Rows are gathered and
turned into time-ordered events (a free before an allocation at the same microsecond).
"""

from __future__ import annotations

import csv
import math
from typing import Iterable, Iterator

from .events import TraceEvent, TraceFormatError, checked_event
from .textio import csv_records, open_for_writing

OPERATOR_MEMORY_COLUMNS = (
    "Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)",
    "Duration(us)", "Active Duration(us)", "Allocation Total Allocated(MB)",
    "Allocation Total Reserved(MB)", "Allocation Total Active(MB)", "Release Total Allocated(MB)",
    "Release Total Reserved(MB)", "Release Total Active(MB)", "Stream Ptr", "Device Type")
REQUIRED = ("Size(KB)", "Allocation Time(us)")


def sniff(head: bytes) -> bool:
    first = head.lstrip().split(b"\n", 1)[0]
    return b"Allocation Time(us)" in first and b"Size(KB)" in first


def _stream(text: str) -> int:
    try:
        return int(text, 0) if text else 0
    except ValueError:
        return 0


def _number(text: str) -> float | None:
    """A finite number, or None for an empty cell; ValueError otherwise."""
    text = text.strip()
    if not text:
        return None
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def read(path: str) -> Iterator[TraceEvent]:
    rows = []                     # (time, 0 for free / 1 for alloc, row number, size, stream)
    unknown_time = []             # rows without an allocation time: placed at the start
    for where, row, column in csv_records(path, REQUIRED, "an operator_memory.csv"):
        cell = {name: row[index] if index < len(row) else "" for name, index in column.items()}
        try:
            size = round(_number(cell["Size(KB)"]) * 1024)
            start = _number(cell["Allocation Time(us)"])
            end = _number(cell.get("Release Time(us)", ""))
            duration = _number(cell.get("Duration(us)", ""))
        except (ValueError, TypeError, OverflowError):
            raise TraceFormatError(path, where, "Size(KB) must be a number, and Allocation "
                                   "Time(us), Release Time(us) and Duration(us) finite numbers "
                                   "(or empty)") from None
        if end is None and duration is not None and start is not None:
            end = start + duration                   # msprof's own layout
        if start is not None and end is not None and end < start:
            raise TraceFormatError(path, where, f"release before allocation: allocated at "
                                   f"{start} us, released at {end} us")
        stream = _stream(cell.get("Stream Ptr", "").strip())
        number = int(where)
        checked_event(path, where, start or 0.0, "", number, abs(size), stream)
        if size < 0:                                 # a release of memory allocated earlier
            when = start if start is not None else end
            if when is None:
                unknown_time.append((0, number, -size, stream))
            else:
                rows.append((when, 0, number, -size, stream))
            continue
        if start is None:
            unknown_time.append((1, number, size, stream))
        else:
            rows.append((start, 1, number, size, stream))
        if end is not None:
            rows.append((end, 0, number, size, stream))
    rows.sort()
    first = rows[0][0] if rows else 0.0
    for is_alloc, number, size, stream in sorted(unknown_time):
        yield TraceEvent(first, "alloc" if is_alloc else "free", number, size, stream)
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
            row = ["trace", event.size / 1024, event.t_us,   # exact: KB in binary fractions
                   "", "", "", "", mb, mb, mb,
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


# --- memory_record.csv: a usage curve, not allocations ------------------------------------------

USAGE_COLUMNS = ("Component", "Timestamp(us)", "Total Allocated(MB)")


def is_usage_curve(head: bytes) -> bool:
    first = head.lstrip().split(b"\n", 1)[0]
    return b"Component" in first and b"Timestamp(us)" in first and b"Total Allocated(MB)" in first


def usage_curves(path: str) -> dict[tuple[str, str], list[tuple]]:
    """memory_record.csv's samples by (component, device): [(time us, allocated MB, reserved MB,
    active MB)], in file order; a missing value is None."""
    curves: dict[tuple[str, str], list] = {}
    for where, row, column in csv_records(path, USAGE_COLUMNS, "a memory_record.csv"):
        cell = {name: row[index].strip() if index < len(row) else "" for name, index in column.items()}
        try:
            values = tuple(_number(cell.get(name, "")) for name in (
                "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)", "Total Active(MB)"))
        except ValueError:
            raise TraceFormatError(path, where, "Timestamp(us) and the totals must be numbers "
                                   "(or empty)") from None
        curves.setdefault((cell["Component"], cell.get("Device Type", "")), []).append(values)
    return curves


def usage_summary(path: str) -> str:
    """memory_record.csv in a few lines: per component and device, the samples, the time they
    span and the peaks of allocated and reserved memory."""
    lines = [f"{path}: a memory usage curve (msprof memory_record.csv): totals over time, "
             "no allocations, so there is nothing to replay"]
    for (component, device), samples in sorted(usage_curves(path).items()):
        times = [sample[0] for sample in samples if sample[0] is not None]
        allocated = max((sample[1] for sample in samples if sample[1] is not None), default=None)
        reserved = max((sample[2] for sample in samples if sample[2] is not None), default=None)
        span = f", over {(max(times) - min(times)) / 1e3:.3f} ms" if len(times) > 1 else ""
        peaks = ", ".join(f"peak {label} {value:g} MB" for label, value in
                          (("allocated", allocated), ("reserved", reserved)) if value is not None)
        lines.append(f"  {component or '?'} on {device or '?'}: {len(samples)} sample(s){span}; "
                     f"{peaks or 'no totals'}")
    return "\n".join(lines) + "\n"
