"""msprof / torch_npu profiler memory CSVs (REFERENCE.md section 5).

memory_record.csv: the device's totals after every event. operator_memory.csv: one row per
allocation, named by its op (or user range, or allocation site), with when it was released
(free requested) and when its memory was really reusable (free completed, later for blocks
another stream still used). Times are wall-clock microseconds; sizes in KB and MB as msprof
writes them. An allocation still live at the end has empty release columns.
"""

from __future__ import annotations

import csv

from ..units import MiB
from .leaks import site_of
from .tracker import MemoryEvent, Tracker

MEMORY_RECORD_COLUMNS = ("Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
                         "Total Active(MB)", "Stream Ptr", "Device Type")
OPERATOR_MEMORY_COLUMNS = (
    "Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)",
    "Duration(us)", "Active Duration(us)", "Allocation Total Allocated(MB)",
    "Allocation Total Reserved(MB)", "Allocation Total Active(MB)", "Release Total Allocated(MB)",
    "Release Total Reserved(MB)", "Release Total Active(MB)", "Stream Ptr", "Device Type")
COMPONENTS = {"pool": "NPUMEM_POOL", "driver": "NPUMEM_DRIVER"}


def _mb(nbytes: int) -> float:
    return round(nbytes / MiB, 6)


def _us(value: float) -> float:
    return round(value, 3)


def write_memory_record(path, tracker: Tracker) -> int:
    """Returns the number of rows written."""
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(MEMORY_RECORD_COLUMNS)
        for event in tracker.events():
            if event.action == "oom":
                continue
            writer.writerow((COMPONENTS[event.source], _us(tracker.wall_us(event.time_ns)),
                             _mb(event.allocated), _mb(event.reserved), _mb(event.active),
                             event.stream, f"NPU:{event.device}"))
            rows += 1
    return rows


def operator_name(event: MemoryEvent) -> str:
    if event.tag:
        return event.tag
    where, frame = site_of(event)
    return f"{frame.name} ({frame.filename.rsplit('/', 1)[-1]}:{frame.line})" if frame else "unknown"


def write_operator_memory(path, tracker: Tracker) -> int:
    """Returns the number of rows (allocations) written."""
    open_allocs: dict = {}           # (source, device, address) -> [alloc, release, active release]
    done = []
    for event in tracker.events():
        key = (event.source, event.device, event.address)
        if event.action == "alloc":
            open_allocs[key] = record = [event, None, None]
            done.append(record)
        elif event.action in ("free", "free_requested", "free_completed"):
            record = open_allocs.get(key)
            if record is None:
                continue                       # allocated before the ring buffer's first event
            if event.action != "free_completed":
                record[1] = event
            if event.action != "free_requested":
                record[2] = event
                del open_allocs[key]
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(OPERATOR_MEMORY_COLUMNS)
        for alloc, release, active in done:
            t0 = tracker.wall_us(alloc.time_ns)
            t1 = tracker.wall_us(release.time_ns) if release else None
            t2 = tracker.wall_us(active.time_ns) if active else None
            end = release or active
            writer.writerow((
                operator_name(alloc), round(alloc.requested / 1024, 3), _us(t0),
                _us(t1) if t1 is not None else "", _us(t2) if t2 is not None else "",
                _us(t1 - t0) if t1 is not None else "", _us(t2 - t0) if t2 is not None else "",
                _mb(alloc.allocated), _mb(alloc.reserved), _mb(alloc.active),
                _mb(end.allocated) if end else "", _mb(end.reserved) if end else "",
                _mb(end.active) if end else "", alloc.stream, f"NPU:{alloc.device}"))
    return len(done)
