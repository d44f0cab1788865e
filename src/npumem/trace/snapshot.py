"""PyTorch memory snapshot pickles (`torch.cuda.memory._snapshot()`): their `device_traces`.

Trace entries are `alloc`, `free_requested` (the tensor died) and `free_completed` (the block
became reusable, later when another stream still used it); a replay frees at `free_completed`,
or at `free_requested` in traces that have no completions. Segment and OOM entries are skipped
here: the model of PyTorch's allocator reads them through `recording`.
"""

from __future__ import annotations

import pickle
from typing import Iterable, Iterator

from .events import TraceEvent, TraceFormatError
from .recording import load_recording
from .step_marks import hint, marks_before, step_positions
from .textio import open_for_writing


def sniff(head: bytes) -> bool:
    return head[:1] == b"\x80"              # pickle protocol 2 or later


def read(path: str, device: int | None = None) -> Iterator[TraceEvent]:
    """Events of one device (default: the first with any). Blocks that were live when the trace
    began come first, as allocations at its first time stamp, so what was in use before the
    recording counts in every replay and conversion."""
    for _, event in _numbered_events(load_recording(path, device)):
        yield event


def read_with_steps(path: str, name: str | None = None) -> tuple[list[TraceEvent], list[int],
                                                                  str | None]:
    """The events of `read` (first device), the positions in them before which a step begins
    (`step_marks`: annotations named `name`, or npumem's own step marks), and a note for a
    replay when there are none but the profiler's steps could be."""
    recording = load_recording(path)
    times = [float(entry.get("time_us", 0) or 0) for entry in recording.entries]
    positions = step_positions(path, recording.annotations, name, times)
    events, marks = marks_before(positions, _numbered_events(recording))
    return events, marks, None if marks else hint(recording.annotations)


def _numbered_events(recording) -> Iterator[tuple[int, TraceEvent]]:
    """(index of the trace entry, event); -1 for the blocks live when the trace began."""
    if not recording.entries:
        raise TraceFormatError(recording.path, "device_traces", "the snapshot has no trace "
                               "entries to replay (record with "
                               "torch.cuda.memory._record_memory_history())")
    free_action = recording.free_action
    first_time = float(recording.entries[0].get("time_us", 0) or 0)
    for block in recording.start_state().live.values():
        yield -1, TraceEvent(first_time, "alloc", block.addr, block.requested, 0)
    for index, entry in enumerate(recording.entries):
        action = entry["action"]
        if action in ("alloc", free_action):
            yield index, TraceEvent(float(entry.get("time_us", 0) or 0),
                                    "alloc" if action == "alloc" else "free",
                                    entry.get("addr", 0), entry.get("size", 0),
                                    int(entry.get("stream", 0) or 0))


def from_events(events: Iterable[TraceEvent]) -> dict:
    """A snapshot dict with no segments and one device trace: what a trace of allocations and
    frees says in the form torch's _memory_viz and npumem's report read."""
    entries = []
    for event in events:
        actions = ("alloc",) if event.action == "alloc" else ("free_requested", "free_completed")
        when = int(event.t_us) if event.t_us == int(event.t_us) else event.t_us   # as PyTorch's
        for action in actions:
            entries.append({"action": action, "addr": event.addr, "size": event.size,
                            "stream": event.stream, "time_us": when, "frames": []})
    return {"segments": [], "device_traces": [entries]}


def write(events: Iterable[TraceEvent], path: str) -> int:
    data = from_events(events)
    save(data, path)
    return sum(1 for entry in data["device_traces"][0] if entry["action"] != "free_requested")


def save(data: dict, path: str) -> int:
    """Pickle a snapshot dict (gzip for .gz); the number of its trace entries. Traces read
    into columns are written as the lists of dicts PyTorch writes."""
    traces = data.get("device_traces")
    if isinstance(traces, list) and any(not isinstance(t, list) for t in traces):
        data = {**data, "device_traces": [list(trace) for trace in traces]}
    try:
        with open_for_writing(path, binary=True) as out:
            pickle.dump(data, out)
    except RecursionError:
        raise TraceFormatError(path, "0", "the snapshot nests too deeply to write") from None
    return sum(len(entries) for entries in data.get("device_traces") or [])
