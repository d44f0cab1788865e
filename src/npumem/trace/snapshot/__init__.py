"""A PyTorch memory snapshot (`torch.cuda.memory._snapshot()`), owned in one place: read safely
(`load_data`: a pickle by npumem's C reader, or the JSONL form, `json_form`), checked
(`schema`), its trace held as columns (`columns`), and as a `Recording` (`recording`) with the
state its trace starts from (`start_state`); written back (`save`); and, as one of the trace
formats, its events (`read`, `write`).

Trace entries are `alloc`, `free_requested` (the tensor died) and `free_completed` (the block
became reusable, later when another stream still used it); a replay frees at `free_completed`,
or at `free_requested` in traces that have no completions. Segment and OOM entries are skipped
here: the model of PyTorch's allocator reads them through `recording`.
"""

from __future__ import annotations

import pickle
from typing import Iterable, Iterator

import numpy as np

from ...events import TraceEvent
from ..file_checks import TraceFormatError
from ..step_marks import hint, marks_before, step_positions
from ..textio import open_for_writing
from . import columns, json_dict, pickle_writer
from .columns import (_CHUNK, ALLOC, FREE_REQUESTED, SEGMENT_ADD, SEGMENT_REMOVE, Entries, arrays,
                      having)
from .recording import Recording, died_at, first_oom, load_data, load_recording, recording_from_data
from .start_state import StartState, read_pool_id

__all__ = ["Recording", "SEGMENT_ADD", "SEGMENT_REMOVE", "SnapshotError", "StartState", "died_at",
           "events", "first_oom", "load_data", "load_recording", "load_snapshot", "read",
           "read_pool_id",
           "read_with_steps", "recording_from_data", "save", "sniff", "write"]


class SnapshotError(ValueError):
    """A snapshot file that cannot be read: says which file and what is wrong."""


def load_snapshot(path) -> dict:
    """Read a snapshot pickle (npumem's or PyTorch's, gzip or not), as plain data only, with
    its structure checked; SnapshotError names the file, the field and what is wrong."""
    try:
        data = load_data(str(path))
    except TraceFormatError as exc:
        raise SnapshotError(str(exc)) from None
    data.setdefault("segments", [])
    data.setdefault("device_traces", [])
    return data


def sniff(head: bytes) -> bool:
    """A pickle: protocol 2 or later (PROTO), or a dict or list in protocol 0 (MARK DICT or
    LIST, PUT) or 1 (EMPTY_DICT or EMPTY_LIST, then BINPUT, LONG_BINPUT or a MARK): what is no
    snapshot is then refused as such. Or a snapshot dict written as one JSON object."""
    return head[:1] == b"\x80" or head.startswith((b"(dp", b"(lp", b"}q", b"}r", b"}(",
                                                     b"]q", b"]r", b"](")) or json_dict.sniff(head)


def read(path: str, device: int | None = None) -> Iterator[TraceEvent]:
    """Events of one device (default: the first with any). Blocks that were live when the trace
    began come first, as allocations at its first time stamp, so what was in use before the
    recording counts in every replay and conversion."""
    recording = load_recording(path, device)
    recording.refuse_if_damaged()
    return events(recording)


def events(recording: Recording) -> Iterator[TraceEvent]:
    """`read`'s events of a recording already loaded."""
    for _, event in _numbered_events(recording):
        yield event


def entry_of_event(recording: Recording, number: int) -> int:
    """The trace entry of `events`' event `number` (-1: a block live when the trace began)."""
    live, chosen = _event_entries(recording)
    return -1 if number < len(live) else int(chosen[number - len(live)])


def read_with_steps(path: str, name: str | None = None, recording: Recording | None = None
                    ) -> tuple[list[TraceEvent], list[int], str | None]:
    """The events of `read` (first device, or `recording` if loaded already), the positions in
    them before which a step begins (`step_marks`: annotations named `name`, or npumem's own
    step marks), and a note for a replay when there are none but the profiler's steps could
    be."""
    recording = recording or load_recording(path)
    times = arrays(recording.entries).time.tolist() if recording.entries else []
    positions = step_positions(path, recording.annotations, name, times)
    found, marks = marks_before(positions, _numbered_events(recording))
    return found, marks, None if marks else hint(recording.annotations)


def _event_entries(recording) -> tuple[list, np.ndarray]:
    """What `events` numbers: the blocks live when the trace began, then the trace's allocs
    and frees (their entries' positions)."""
    if not recording.entries:
        raise TraceFormatError(recording.path, "device_traces", "the snapshot has no trace "
                               "entries to replay (record with "
                               "torch.cuda.memory._record_memory_history())")
    a = arrays(recording.entries)
    live = list(recording.start_state(pools=False).live.values())
    return live, np.flatnonzero(having(a.action, "alloc", recording.free_action))


def _numbered_events(recording) -> Iterator[tuple[int, TraceEvent]]:
    """(index of the trace entry, event); -1 for the blocks live when the trace began."""
    live, chosen = _event_entries(recording)
    a = arrays(recording.entries)
    first_time = float(a.time[0])
    for block in live:
        yield -1, TraceEvent(first_time, "alloc", block.addr, block.requested, 0)
    for begin in range(0, len(chosen), _CHUNK):          # the columns read a chunk at a time
        at = chosen[begin:begin + _CHUNK]
        for index, when, code, addr, size, stream in zip(
                at.tolist(), a.time[at].tolist(), a.action[at].tolist(), a.addr[at].tolist(),
                a.size[at].tolist(), a.stream[at].tolist()):
            yield index, TraceEvent(when, "alloc" if code == ALLOC else "free", addr, size,
                                    stream)


def from_events(events: Iterable[TraceEvent] | Entries) -> dict:
    """A snapshot dict with no segments and one device trace: what a trace of allocations and
    frees (events, or `columns.from_events`' entries) says in the form torch's _memory_viz and
    npumem's report read: each free is the free_requested and free_completed PyTorch records
    for a block freed on its own stream, and whole times are ints, as PyTorch's."""
    entries = events if isinstance(events, Entries) else columns.from_events(events)
    if not isinstance(entries, Entries):          # numbers past 64 bits: a dict per entry
        recorded = []
        for e in entries:
            when = e["time_us"]
            e["time_us"] = int(when) if when == int(when) else when
            recorded += ([e] if e["action"] == "alloc" else
                         [{**e, "action": "free_requested"}, e])
        return {"segments": [], "device_traces": [recorded]}
    c = entries.columns
    span = slice(entries.start, entries.stop)
    counts = np.where(c.action[span] == ALLOC, 1, 2)
    twice = np.repeat(np.arange(span.start, span.stop), counts)
    action = c.action[twice]
    action[(np.cumsum(counts) - counts)[counts == 2]] = FREE_REQUESTED   # a free's first entry
    times = c.times(span.start, span.stop)[twice - span.start]
    with np.errstate(invalid="ignore"):                # (nan and infinities stay floats)
        whole = (times == np.floor(times)) & (np.abs(times) < 2.0 ** 63)
        bits = np.where(whole, times.astype(np.int64), times.view(np.int64))
    raw = {"rows": len(twice), "action": action, "addr": c.addr[twice], "size": c.size[twice],
           "stream": c.stream[twice], "time": bits}
    return {"segments": [], "device_traces": [columns.from_event_columns(raw, ~whole)]}


def write(events: Iterable[TraceEvent], path: str) -> int:
    data = from_events(events)
    save(data, path)
    trace = data["device_traces"][0]
    return len(trace) - len(columns.indices(trace, "free_requested"))


def save(data: dict, path: str) -> int:
    """Pickle a snapshot dict (gzip for .gz); the number of its trace entries. Traces read
    into columns are written as the lists of dicts PyTorch writes, a chunk at a time."""
    traces = data.get("device_traces")
    streamed = pickle_writer.streams(data)
    if not streamed and isinstance(traces, list) and any(not isinstance(t, list) for t in traces):
        data = {**data, "device_traces": [list(trace) for trace in traces]}
    try:
        with open_for_writing(path, binary=True) as out:
            if streamed:
                return pickle_writer.dump(data, out)
            pickle.dump(data, out)
    except RecursionError:
        raise TraceFormatError(path, "", "the snapshot nests too deeply to write") from None
    return sum(len(entries) for entries in data.get("device_traces") or [])
