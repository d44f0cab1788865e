"""PyTorch profiler Chrome traces: `[memory]` instant events with args.Addr and args.Bytes
(negative on free), as `torch.profiler.profile(profile_memory=True)` exports them.

The reader scans the `traceEvents` array one object at a time, so a trace of millions of events
never becomes one Python object tree; the memory events are kept as compact arrays and sorted
by timestamp (the profiler does not write them in order).
"""

from __future__ import annotations

import json
from array import array
from typing import Iterable, Iterator

import numpy as np

from ..events import TraceEvent
from .file_checks import TraceFormatError, checked_event
from .step_marks import hint, step_positions
from .textio import json_refusal, open_for_writing, reading

CHUNK = 1 << 20


def sniff(head: bytes) -> bool:
    text = head.lstrip()
    return text.startswith(b"[") or (text.startswith(b"{") and b'"traceEvents"' in head)


def _items(path: str, handle) -> Iterator[tuple[int, dict]]:
    """(character offset, object) for each element of the trace's event array."""
    decoder = json.JSONDecoder()
    buffer, base, eof = "", 0, False

    def more() -> bool:
        nonlocal buffer, eof
        chunk = handle.read(CHUNK)
        eof = not chunk
        buffer += chunk
        return bool(chunk)

    more()
    start = buffer.lstrip()
    if start.startswith("{"):
        while (key := buffer.find('"traceEvents"')) < 0:
            if not more():
                raise TraceFormatError(path, "traceEvents", "no traceEvents list")
        pos = key + len('"traceEvents"')
        while True:
            rest = buffer[pos:].lstrip(" \t\r\n:")
            if rest or not more():
                break
        pos = len(buffer) - len(rest)
        if not rest.startswith("["):
            raise TraceFormatError(path, f"char {pos}", "traceEvents is not a list")
    elif start.startswith("["):
        pos = len(buffer) - len(start)
    else:
        raise TraceFormatError(path, "char 0", "not a Chrome trace (expected '[' or '{')")
    pos += 1
    while True:
        while True:
            while pos < len(buffer) and buffer[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buffer) or not more():
                break
        if pos >= len(buffer):
            raise TraceFormatError(path, f"char {base + pos}", "the file ends inside traceEvents")
        if buffer[pos] == "]":
            return
        try:
            item, end = decoder.raw_decode(buffer, pos)
        except json.JSONDecodeError as exc:
            if not eof and more():
                continue
            raise TraceFormatError(path, f"char {base + exc.pos}",
                                   f"not valid JSON ({exc.msg})") from None
        except (RecursionError, ValueError) as exc:
            raise TraceFormatError(path, f"char {base + pos}", json_refusal(exc)) from None
        yield base + pos, item
        pos = end
        if pos > CHUNK:                      # drop what has been decoded
            buffer, base, pos = buffer[pos:], base + pos, 0


def read(path: str) -> Iterator[TraceEvent]:
    yield from _sorted(_scan(path))


def read_with_steps(path: str, name: str | None = None) -> tuple[Iterator[TraceEvent],
                                                                  list[int], str | None]:
    """The events of `read`, the positions in them before which a step begins (START of each
    user annotation span named `name` or `name#...`: ProfilerStep for the profiler's steps,
    or a record_function name; none without a name), and a note for a replay when there are
    none but the profiler's steps could be."""
    annotations: list[dict] = []
    arrays = _scan(path, annotations)
    times = np.sort(np.frombuffer(arrays[0], dtype=np.float64))
    # positions in the time-ordered events are where the marks go (the events stream)
    marks = sorted({min(position, len(times))
                    for position in step_positions(path, annotations, name, times)})
    return _sorted(arrays), marks, None if marks else hint(annotations)


def _scan(path: str, annotations: list[dict] | None = None) -> tuple:
    """The [memory] events, as arrays (times, addresses, sizes, streams, frees), in file
    order; with `annotations`, each user annotation span's start is added to it (as a
    snapshot's START annotations: name, stage, time_us)."""
    times, addrs, sizes, streams = array("d"), array("Q"), array("Q"), array("Q")
    frees = bytearray()
    with reading(path) as handle:
        for offset, event in _items(path, handle):
            if not isinstance(event, dict):
                continue
            if event.get("name") != "[memory]":
                if annotations is not None and event.get("cat") == "user_annotation" \
                        and event.get("ph") in ("X", "B"):
                    annotations.append({"name": event.get("name"), "stage": "START",
                                        "time_us": event.get("ts")})
                continue
            where = f"char {offset}"
            args = event.get("args")
            if not isinstance(args, dict):
                raise TraceFormatError(path, where, "[memory] event whose args is not an object")
            nbytes, addr = args.get("Bytes"), args.get("Addr")
            if isinstance(nbytes, bool) or not isinstance(nbytes, int):
                raise TraceFormatError(path, where, f"[memory] event without an integer "
                                       f"args.Bytes (got {nbytes!r:.40})")
            stream = args.get("Stream", 0)          # npumem writes it; the profiler does not
            checked = checked_event(path, where, event.get("ts", 0.0), "", addr, abs(nbytes),
                                    stream if isinstance(stream, int) else 0)
            times.append(checked.t_us)
            addrs.append(checked.addr)
            sizes.append(checked.size)
            streams.append(checked.stream)
            frees.append(nbytes < 0)
    if not times:
        raise TraceFormatError(path, "traceEvents", "no [memory] events; record the trace with "
                               "torch.profiler.profile(profile_memory=True)")
    return times, addrs, sizes, streams, frees


def _sorted(arrays: tuple) -> Iterator[TraceEvent]:
    """The events in time order (the profiler does not write them in order)."""
    times, addrs, sizes, streams, frees = arrays
    order = np.argsort(np.frombuffer(times, dtype=np.float64), kind="stable")
    for k in order.tolist():
        yield TraceEvent(times[k], "free" if frees[k] else "alloc", addrs[k], sizes[k],
                         streams[k])


def write(events: Iterable[TraceEvent], path: str) -> int:
    """Write the events as the profiler does, streaming; Total Allocated is the running sum.

    Each stream gets a small tid and a thread_name naming it (stream handles are pointers,
    above 2**31, which viewers truncate into one track)."""
    count = allocated = 0
    tracks: dict[int, int] = {}
    with open_for_writing(path) as out:
        out.write('{"schemaVersion": 1, "traceEvents": [\n')
        for event in events:
            signed = event.size if event.action == "alloc" else -event.size
            allocated += signed
            tid = tracks.setdefault(event.stream, len(tracks) + 1)
            record = {"ph": "i", "s": "t", "name": "[memory]", "pid": 0, "tid": tid,
                      "ts": event.t_us, "args": {"Addr": event.addr, "Bytes": signed,
                                                 "Total Allocated": allocated, "Device Id": 0,
                                                 "Stream": event.stream}}
            out.write(("," if count else "") + json.dumps(record, separators=(",", ":")) + "\n")
            count += 1
        for stream, tid in tracks.items():
            name = "default stream" if stream == 0 else f"stream 0x{stream:x}"
            out.write("," + json.dumps({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid,
                                        "args": {"name": name}}) + "\n")
        out.write('], "displayTimeUnit": "ms"}\n')
    return count
