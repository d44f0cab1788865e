"""Every trace format npumem reads and writes, detected from the file's first bytes.

    read_trace(path)            -> iterator of TraceEvent, in time order (and its notes)
    read_mended(path)           -> those events as a snapshot trace's entries (columns)
    read_with_steps(path, name) -> those events, where steps begin, a note (step_marks)
    write_trace(events, path)   -> number of events written (format from the name or `fmt`)
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator

from . import chrome, jsonl, msprof, rmm, snapshot
from .snapshot import json_form
from ..events import TraceEvent
from ..file_paths import not_a_file
from .file_checks import TraceFormatError
from . import mending
from .textio import read_head

# name -> module with sniff(head), read(path) and write(events, path); sniffed in this order.
FORMATS = {"snapshot": snapshot, "rmm": rmm, "msprof": msprof, "jsonl": jsonl, "chrome": chrome}
DESCRIPTIONS = {
    "jsonl": "npumem JSONL (.jsonl)",
    "chrome": "PyTorch profiler Chrome trace with [memory] events (.json)",
    "snapshot": "PyTorch memory snapshot pickle, device_traces (.pickle)",
    "rmm": "RMM logging adaptor CSV (.csv)",
    "msprof": "msprof operator_memory.csv",
}


def detect_format(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    head = read_head(path)
    if not head.strip():
        raise TraceFormatError(path, "1", "the file is empty")
    for name, module in FORMATS.items():
        if module.sniff(head):
            return name
    if msprof.is_usage_curve(head):
        raise TraceFormatError(path, "1", "a memory usage curve (msprof memory_record.csv: totals "
                               "over time, no allocations), so there is nothing to replay, "
                               "convert, diff or view; `npumem report` summarizes it, and "
                               "msprof's operator_memory.csv holds the allocations")
    if msprof.is_module_memory(head):
        raise TraceFormatError(path, "1", "reserved memory by CANN component (msprof / torch_npu "
                               "npu_module_mem.csv: totals over time, no allocations), so there "
                               "is nothing to replay, convert, diff or view; `npumem report` "
                               "summarizes it")
    if b'"allocated_bytes.all.current"' in head or b'"reserved_bytes.all.current"' in head:
        raise TraceFormatError(path, "1", "PyTorch's memory_stats() (totals, no allocations), so "
                               "there is nothing to replay, convert, diff or view; `npumem "
                               "report` reads it")
    if path.lower().endswith(".gz"):
        with open(path, "rb") as handle:
            if handle.read(2) != b"\x1f\x8b":
                raise TraceFormatError(path, "1", "named .gz but not gzip-compressed, and not "
                                       "a trace npumem reads either (a file renamed, or saved "
                                       "uncompressed under a .gz name?)")
    raise TraceFormatError(path, "1", "unknown trace format; npumem reads "
                           + "; ".join(DESCRIPTIONS.values()))


def holds_snapshot(path: str | os.PathLike) -> bool:
    """Whether the file is a whole memory snapshot: a pickle, or JSONL written from one."""
    path = os.fspath(path)
    fmt = detect_format(path)
    return fmt == "snapshot" or (fmt == "jsonl" and jsonl.holds_snapshot(read_head(path, 64)))


def convert(source: str, target: str, fmt: str, notes: list[str] | None = None,
            loaded: dict | None = None) -> int:
    """Write `source` as `target` in `fmt`; the number of events (or snapshot entries) written.

    A whole snapshot (pickle or JSONL) going to a snapshot pickle or JSONL is copied entire:
    segments, blocks, frames, every action and setting. msprof's operator_memory.csv going to
    either becomes a snapshot whose allocations carry their operator as a frame. Other
    conversions carry each allocation and free (time, address, size, stream), which is what the
    other formats hold. `notes` gathers what reading the source passed over or reinterpreted;
    `loaded` gets a snapshot source read whole, by path (for its OOM lines, without a second
    read)."""
    notes = [] if notes is None else notes
    if holds_snapshot(source):                    # read once, whatever it becomes
        data = snapshot.load_data(source)
        if loaded is not None:
            loaded[source] = data
        if fmt in ("snapshot", "jsonl"):
            return _write_snapshot(fmt, data, target)
        return write_trace(snapshot.events(snapshot.recording_from_data(data, source)), target,
                           fmt)
    if detect_format(source) == "msprof":
        if fmt in ("snapshot", "jsonl"):
            data, found = msprof.to_snapshot(source)
            notes += found
            return _write_snapshot(fmt, data, target)
        counts: dict[str, int] = {}
        written = write_trace(msprof.read(source, counts), target, fmt)
        notes += msprof.describe(counts)
        return written
    events = read_trace(source)
    written = write_trace(events, target, fmt)
    notes += events.notes
    return written


def _write_snapshot(fmt: str, data: dict, target: str) -> int:
    return (json_form.write_snapshot if fmt == "jsonl" else snapshot.save)(data, target)


class TraceEvents(Iterator[TraceEvent]):
    """A trace's events (an iterator) and `notes`: what reading it changed (`mending`)."""

    def __init__(self, events: Iterable[TraceEvent], notes: Iterable[str] = ()):
        self._events = iter(events)
        self.notes = list(notes)

    def __next__(self) -> TraceEvent:
        return next(self._events)


def read_trace(path: str | os.PathLike, fmt: str | None = None) -> TraceEvents:
    """The events of a trace file in time order, as `mending` reads a trace with holes in an
    address's story; a JSONL file holding a whole snapshot, as the snapshot's."""
    path = _existing(path)
    fmt = fmt or detect_format(path)
    if fmt == "jsonl" and jsonl.holds_snapshot(read_head(path, 64)):
        fmt = "snapshot"
    if fmt == "snapshot":
        return TraceEvents(snapshot.read(path))
    if fmt == "jsonl" and jsonl.in_columns() and mending.whole(jsonl.column_chunks(path)):
        return TraceEvents(jsonl.read(path))      # read twice, a chunk at a time: memory flat
    mended = read_mended(path, fmt)
    return TraceEvents(snapshot.columns.to_events(mended.entries), mended.notes)


def read_mended(path: str | os.PathLike, fmt: str | None = None) -> mending.Mended:
    """A trace that is not a whole snapshot, as a snapshot trace's entries (columns, not a
    dict or an event per line where the format's reader makes them: JSONL), mended."""
    path = _existing(path)
    fmt = fmt or detect_format(path)
    if fmt == "jsonl":
        return mending.mend(jsonl.read_entries(path))
    if fmt == "msprof":                   # its odd rows, said as report and convert say them
        counts: dict[str, int] = {}
        mended = mending.mend(snapshot.columns.from_events(msprof.read(path, counts)),
                              lines_for_addresses=True)
        mended.notes[:0] = msprof.describe(counts)
        return mended
    return mending.mend(snapshot.columns.from_events(FORMATS[fmt].read(path)))


def _existing(path: str | os.PathLike) -> str:
    """`path` as a string, if it names a file (TraceFormatError says why not)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise TraceFormatError(path, "", not_a_file(path))
    return path


def carries_annotations(path: str | os.PathLike) -> bool:
    """Whether the trace's format can say where steps begin (`read_with_steps`)."""
    return holds_snapshot(path) or detect_format(path) == "chrome"


def read_with_steps(path: str | os.PathLike, name: str | None = None,
                    recording=None) -> tuple[
        Iterable[TraceEvent], list[int], str | None]:
    """The events of `read_trace`, the positions in them before which a step begins, from
    the trace's annotations (`step_marks`: a snapshot's or a Chrome trace's; named `name`, or
    npumem.memory.step() calls), and a note when a replay could mark steps but does not.
    `recording`: the snapshot's, if loaded already."""
    path = _existing(path)
    if recording is not None or holds_snapshot(path):
        found, marks, note = snapshot.read_with_steps(path, name, recording)
        return TraceEvents(found), marks, note
    fmt = detect_format(path)
    if fmt == "chrome":
        events, marks, note = chrome.read_with_steps(path, name)
        mended = mending.mend(snapshot.columns.from_events(events))
        return (TraceEvents(snapshot.columns.to_events(mended.entries), mended.notes),
                [mended.position(mark) for mark in marks], note)
    if name:
        raise TraceFormatError(path, "", f"a {fmt} trace has no annotations to mark steps by "
                               "(memory snapshots and profiler Chrome traces do)")
    return read_trace(path, fmt), [], None


def format_for_output(path: str) -> str:
    """The format a file name asks for: .jsonl, .json, .pickle/.pkl, operator_memory*.csv, .csv."""
    name = os.path.basename(path).lower().removesuffix(".gz")
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".json"):
        return "chrome"
    if name.endswith((".pickle", ".pkl")):
        return "snapshot"
    if name.endswith(".csv") or ".csv.dev" in name:          # RMM's Python log names: .csv.dev0
        return "msprof" if "operator_memory" in name else "rmm"
    raise ValueError(f"cannot tell the format from {path!r}; name it .jsonl, .json, .pickle, "
                     "operator_memory.csv or .csv (RMM log), or pass the format")


def write_trace(events: Iterable[TraceEvent], path: str | os.PathLike, fmt: str | None = None) -> int:
    path = os.fspath(path)
    fmt = fmt or format_for_output(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    return FORMATS[fmt].write(events, path)
