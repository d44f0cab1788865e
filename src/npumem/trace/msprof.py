"""msprof / torch_npu profiler memory files (REFERENCE.md section 5; docs/formats.md gives every
column). `operator_memory.csv`: one row per allocation, named by its operator, with the time it
was allocated and released. `memory_record.csv` and `npu_module_mem.csv`: totals over time by
component, read as usage curves.

Two layouts are read: torch_npu's (`Name,Size(KB),Allocation Time(us),Release Time(us),...`) and
msprof's own `operator_memory_*.csv` (`Device_id,Name,Size(KB),Allocation Time(us),Duration(us),
...`), whose release is the allocation time plus the duration. Times may carry a trailing tab.

The rows carry no address, so the reader numbers them. An empty release time (or duration) means
the memory was still allocated at the end. Rows CANN documents as possible are taken for what
they are: a negative size is the release of memory allocated before collection began (a free of
a block the trace never saw allocated, which replays count as such); an empty allocation time
means the time is unknown, and the row is placed at the start of the trace. Rows are gathered and
turned into time-ordered events (a free before an allocation at the same microsecond), or into
a snapshot whose allocations carry their operator as a frame (`to_snapshot`), which is what
report, diff and convert use so that the operator is the allocation site. Odd rows are counted
and described in notes (`describe`), never a traceback.
"""

from __future__ import annotations

import csv
import math
import re
from typing import Iterable, Iterator, NamedTuple

from ..units import MiB, format_size
from ..events import TraceEvent
from .file_checks import TraceFormatError, checked_event
from .textio import csv_records, open_for_writing, read_head

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


class OperatorRow(NamedTuple):
    """One allocation of operator_memory.csv, as far as the file knows it. `size` is in bytes
    and negative for a release whose allocation came before the profiler started; `start` and
    `end` are microseconds, None where the file leaves them empty (end: still allocated when
    the profiler stopped)."""

    number: int            # the row's line, which stands for its address
    name: str
    size: int
    start: float | None
    end: float | None
    stream: int
    device: int


# Each kind of odd row the readers pass over or reinterpret: (count -> sentence).
ODDITIES = {
    "negative": "{n} row{s} with a negative size: read as release{s} of memory allocated before "
                "the profiler started (CANN writes these; the operator is unknown)",
    "negative_untimed": "{n} of those with no time at all: left off the timeline",
    "no_start": "{n} row{s} with no allocation time: placed at the start of the profile",
    "no_size": "{n} row{s} with no size: skipped",
    "no_end": "{n} allocation{s} with no release time: still allocated when the profiler "
              "stopped",
    "active_end": "{n} allocation{s} with no release time but an active release time: read "
                  "as released then",
    "negative_total": "{n} total{s} below zero (npu_module_mem writes -1 where only releases "
                      "were collected): read as unknown",
}


def describe(counts: dict[str, int]) -> list[str]:
    """The notes for `counts` of odd rows, one sentence per kind, in ODDITIES' order."""
    return [text.format(n=counts[kind], s="" if counts[kind] == 1 else "s")
            for kind, text in ODDITIES.items() if counts.get(kind)]


_DEVICE = re.compile(r"(\d+)\s*$")


def _device(cell: dict) -> int:
    """The device number: `NPU:3` in Device Type (torch_npu) or Device (msprof), else
    Device_id, else 0."""
    for name in ("Device Type", "Device", "Device_id"):
        match = _DEVICE.search(cell.get(name, "").strip())
        if match:
            return min(int(match.group(1)), 1023)
    return 0


def read_rows(path: str, counts: dict[str, int] | None = None) -> Iterator[OperatorRow]:
    """The rows of an operator_memory CSV (either layout) in file order; `counts` gathers how
    many rows of each kind in ODDITIES were met. Cells that are not numbers where numbers
    belong, and releases before allocations, are TraceFormatErrors naming the line."""
    counts = {} if counts is None else counts

    def count(kind: str) -> None:
        counts[kind] = counts.get(kind, 0) + 1

    wanted = ("Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Duration(us)",
              "Active Release Time(us)", "Stream Ptr", "Device Type", "Device", "Device_id")
    devices: dict[tuple, int] = {}              # the device cells seen, read once each
    for where, row, column in csv_records(path, REQUIRED, "an operator_memory.csv"):
        width = len(row)
        cell = {name: row[column[name]] if column.get(name, width) < width else ""
                for name in wanted}
        try:
            kilobytes = _number(cell["Size(KB)"])
            start = _number(cell["Allocation Time(us)"])
            end = _number(cell.get("Release Time(us)", ""))
            duration = _number(cell.get("Duration(us)", ""))
            active_end = _number(cell.get("Active Release Time(us)", ""))
            size = None if kilobytes is None else round(kilobytes * 1024)
        except (ValueError, OverflowError):
            raise TraceFormatError(path, where, "Size(KB) must be a number, and Allocation "
                                   "Time(us), Release Time(us) and Duration(us) finite numbers "
                                   "(or empty)") from None
        if size is None:
            count("no_size")
            continue
        if end is None and duration is not None and start is not None:
            end = start + duration                   # msprof's own layout
        if end is None and active_end is not None and size >= 0:
            end = active_end
            count("active_end")
        if start is not None and end is not None and end < start:
            raise TraceFormatError(path, where, f"release before allocation: allocated at "
                                   f"{start} us, released at {end} us")
        stream = _stream(cell.get("Stream Ptr", "").strip())
        checked_event(path, where, start or 0.0, "", int(where), abs(size), stream)
        if size < 0:
            count("negative")
            if start is None and end is None:
                count("negative_untimed")
        elif start is None:
            count("no_start")
        elif end is None:
            count("no_end")
        key = (cell["Device Type"], cell["Device"], cell["Device_id"])
        device = devices.get(key)
        if device is None:
            device = devices[key] = _device(cell)
        yield OperatorRow(int(where), cell["Name"].strip(), size, start, end, stream, device)


def _release_order(start: float | None, end: float) -> int:
    """Where a release goes among the events of its time (allocs are 1): before the allocs,
    but after them when it releases a block made at that time (a zero duration)."""
    return 2 if end == start else 0


def read(path: str, counts: dict[str, int] | None = None) -> Iterator[TraceEvent]:
    """Allocations and frees in time order. A negative size is a free, at its time, of a block
    the trace never saw allocated (read as allocated before the trace began: trace/mending.py);
    one without any time cannot be placed and is left out, as `to_snapshot` leaves it. A row
    without an allocation time is allocated at the start."""
    rows = []                     # (time, order (_release_order; 1: alloc), row, size, stream)
    unknown_time = []             # allocations without a time: placed at the start
    for row in read_rows(path, counts):
        number, size, stream = row.number, row.size, row.stream
        if size < 0:                                 # a release of memory allocated earlier
            when = row.start if row.start is not None else row.end
            if when is not None:
                rows.append((when, 0, number, -size, stream))
            continue
        if row.start is None:
            unknown_time.append((number, size, stream))
        else:
            rows.append((row.start, 1, number, size, stream))
        if row.end is not None:
            rows.append((row.end, _release_order(row.start, row.end), number, size, stream))
    rows.sort()
    first = rows[0][0] if rows else 0.0
    for number, size, stream in sorted(unknown_time):
        yield TraceEvent(first, "alloc", number, size, stream)
    for when, order, number, size, stream in rows:
        yield TraceEvent(when, "alloc" if order == 1 else "free", number, size, stream)


OPERATOR_FILE = "<operator>"     # the filename of a frame that names an operator, not code
BEFORE = "allocated before the profiler started"


def operator_frame(name: str) -> dict:
    """A snapshot frame standing for an operator: the operator is where an Ascend allocation
    was made, as a Python line is for a PyTorch one."""
    return {"name": name or "(unnamed operator)", "filename": OPERATOR_FILE, "line": 0}


def to_snapshot(path: str) -> tuple[dict, list[str]]:
    """The file as a snapshot dict (no segments, one trace per device) whose allocations carry
    their operator as a frame, so report, diff and the viewers group by operator; and the
    notes on odd rows. A release with a time but no allocation in the window is a block
    allocated at the trace's first time (user_metadata says so); one without any time cannot
    be placed and is left out (a note says how many)."""
    counts: dict[str, int] = {}
    rows = list(read_rows(path, counts))
    times = [t for row in rows for t in (row.start, row.end) if t is not None]
    first = min(times) if times else 0.0
    by_device: dict[int, list[tuple]] = {}
    frames_of: dict[str, list[dict]] = {}       # one list per operator, shared by its entries
    for row in rows:
        entries = by_device.setdefault(row.device, [])
        common = {"addr": row.number, "size": abs(row.size), "stream": row.stream}
        if row.size < 0:
            when = row.end if row.end is not None else row.start
            if when is None:
                continue
            entries.append((first, -1, row.number, {"action": "alloc", **common, "time_us": first,
                                                    "frames": [], "user_metadata": BEFORE}))
            entries += [(when, 0, row.number, {"action": action, **common, "time_us": when,
                                               "frames": []})
                        for action in ("free_requested", "free_completed")]
            continue
        start = row.start if row.start is not None else first
        frames = frames_of.get(row.name)
        if frames is None:
            frames = frames_of[row.name] = [operator_frame(row.name)]
        entries.append((start, 1, row.number, {"action": "alloc", **common, "time_us": start,
                                               "frames": frames}))
        if row.end is not None:
            order = _release_order(start, row.end)
            entries += [(row.end, order, row.number, {"action": action, **common,
                                                      "time_us": row.end, "frames": frames})
                        for action in ("free_requested", "free_completed")]
    traces: list[list[dict]] = [[] for _ in range(max(by_device, default=0) + 1)]
    for device, entries in by_device.items():
        entries.sort(key=lambda item: item[:3])      # at one time frees, allocs, then releases
        traces[device] = [entry for *_, entry in entries]
    return {"segments": [], "device_traces": traces}, describe(counts)


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


# --- memory_record.csv and npu_module_mem.csv: usage curves, not allocations -------------------

USAGE_COLUMNS = ("Component", "Timestamp(us)")
TOTALS = ("Total Allocated", "Total Reserved", "Total Active")


def _unit_of(header: bytes | list[str], total: str) -> float | None:
    """MB per unit of the `total` column in `header` (torch_npu writes MB, msprof KB), or None
    when the column is not there."""
    names = header.decode("utf-8", "replace").split(",") if isinstance(header, bytes) else header
    names = [name.strip().strip('"') for name in names]
    if f"{total}(MB)" in names:
        return 1.0
    if f"{total}(KB)" in names:
        return 1 / 1024
    return None


def _first_line(head: bytes) -> bytes:
    return head.lstrip().split(b"\n", 1)[0].rstrip(b"\r")


def is_usage_curve(head: bytes) -> bool:
    """memory_record.csv (torch_npu's, in MB) or memory_record_*.csv (msprof's, in KB)."""
    first = _first_line(head)
    return (b"Component" in first and b"Timestamp(us)" in first
            and _unit_of(first, "Total Allocated") is not None)


def is_module_memory(head: bytes) -> bool:
    """npu_module_mem.csv: reserved memory by CANN component, no allocated column."""
    first = _first_line(head)
    return (b"Component" in first and b"Timestamp(us)" in first
            and _unit_of(first, "Total Reserved") is not None
            and _unit_of(first, "Total Allocated") is None)


def usage_curves(path: str, counts: dict[str, int] | None = None) -> dict[tuple[str, str], list[tuple]]:
    """memory_record.csv's (or npu_module_mem.csv's) samples by (component, device): [(time us,
    allocated MB, reserved MB, active MB)], in file order; a missing value is None. KB files are
    scaled to MB. A -1 in npu_module_mem (CANN: only releases were collected for that
    component) reads as None, counted in `counts` (ODDITIES' "negative_total")."""
    counts = {} if counts is None else counts
    curves: dict[tuple[str, str], list] = {}
    units: dict[str, float | None] = {}
    for where, row, column in csv_records(path, USAGE_COLUMNS, "a memory_record.csv or "
                                          "npu_module_mem.csv"):
        if not units:
            units = {total: _unit_of(list(column), total) for total in TOTALS}
            if all(units[total] is None for total in TOTALS):
                raise TraceFormatError(path, "1", "not a memory_record.csv or npu_module_mem.csv: "
                                       "no Total Allocated or Total Reserved column")
        cell = {name: row[index].strip() if index < len(row) else "" for name, index in column.items()}
        try:
            time = _number(cell.get("Timestamp(us)", ""))
            values = []
            for total in TOTALS:
                unit = units[total]
                name = f"{total}({'MB' if unit == 1.0 else 'KB'})"
                value = _number(cell.get(name, "")) if unit is not None else None
                if value is not None and value < 0:
                    counts["negative_total"] = counts.get("negative_total", 0) + 1
                    value = None
                values.append(None if value is None else value * unit)
        except (ValueError, OverflowError):
            raise TraceFormatError(path, where, "Timestamp(us) and the totals must be numbers "
                                   "(or empty)") from None
        device = cell.get("Device Type", "") or cell.get("Device", "")
        curves.setdefault((cell["Component"], device), []).append((time, *values))
    return curves


def usage_summary(path: str) -> str:
    """memory_record.csv (or npu_module_mem.csv) in a few lines: per component and device, the
    samples, the time they span and the peaks of allocated and reserved memory."""
    module = is_module_memory(read_head(path))
    kind = ("reserved memory by CANN component (npu_module_mem.csv)" if module else
            "a memory usage curve (msprof memory_record.csv)")
    lines = [f"{path}: {kind}: totals over time, no allocations, so there is nothing to replay"]
    for (component, device), samples in sorted(usage_curves(path).items()):
        times = [sample[0] for sample in samples if sample[0] is not None]
        allocated = max((sample[1] for sample in samples if sample[1] is not None), default=None)
        reserved = max((sample[2] for sample in samples if sample[2] is not None), default=None)
        span = f", over {(max(times) - min(times)) / 1e3:.3f} ms" if len(times) > 1 else ""
        # the files' "MB" are MiB (torch_npu divides bytes by 1024 twice)
        peaks = ", ".join(f"peak {label} {format_size(int(value * MiB))}" for label, value in
                          (("allocated", allocated), ("reserved", reserved)) if value is not None)
        lines.append(f"  {component or '?'} on {device or '?'}: {len(samples)} sample(s){span}; "
                     f"{peaks or 'no totals'}")
    return "\n".join(lines) + "\n"
