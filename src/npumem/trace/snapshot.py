"""PyTorch memory snapshot pickles (`torch.cuda.memory._snapshot()`): their `device_traces`.

Trace entries are `alloc`, `free_requested` (the tensor died) and `free_completed` (the block
became reusable, later when another stream still used it); a replay frees at `free_completed`,
or at `free_requested` in traces that have no completions. Segment and OOM entries are skipped.
"""

from __future__ import annotations

import pickle
from typing import Iterable, Iterator

from .events import TraceEvent, TraceFormatError
from .textio import open_binary, open_for_writing


def sniff(head: bytes) -> bool:
    return head[:1] == b"\x80"              # pickle protocol 2 or later


def _device_trace(path: str, device: int | None) -> list:
    try:
        with open_binary(path) as handle:
            data = pickle.load(handle)
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, AttributeError,
            ImportError, IndexError) as exc:
        raise TraceFormatError(path, "0", f"not a readable pickle ({type(exc).__name__}: {exc})") from None
    traces = data.get("device_traces") if isinstance(data, dict) else None
    if not isinstance(traces, list):
        raise TraceFormatError(path, "device_traces", "not a memory snapshot with device_traces "
                               "(record with torch.cuda.memory._record_memory_history())")
    used = [index for index, trace in enumerate(traces) if trace]
    if device is None:
        if not used:
            raise TraceFormatError(path, "device_traces", "every device trace is empty")
        device = used[0]
    if not 0 <= device < len(traces):
        raise TraceFormatError(path, "device_traces", f"no device {device}; devices with events: "
                               f"{used}")
    return traces[device]


def read(path: str, device: int | None = None) -> Iterator[TraceEvent]:
    """Events of one device (default: the first with any)."""
    entries = _device_trace(path, device)
    completes = any(isinstance(e, dict) and e.get("action") == "free_completed" for e in entries)
    free_action = "free_completed" if completes else "free_requested"
    for index, entry in enumerate(entries):
        where = f"device_traces[{index}]"
        if not isinstance(entry, dict):
            raise TraceFormatError(path, where, "a trace entry is not a dict")
        action = entry.get("action")
        if action not in ("alloc", free_action):
            continue
        addr, size = entry.get("addr"), entry.get("size")
        if not isinstance(addr, int) or not isinstance(size, int):
            raise TraceFormatError(path, where, f"{action} entry without integer addr and size")
        yield TraceEvent(float(entry.get("time_us", 0) or 0), "alloc" if action == "alloc" else "free",
                         addr, size, int(entry.get("stream", 0) or 0))


def write(events: Iterable[TraceEvent], path: str) -> int:
    """A snapshot with no segments and one device trace, which torch's _memory_viz plots."""
    entries = []
    for event in events:
        actions = ("alloc",) if event.action == "alloc" else ("free_requested", "free_completed")
        for action in actions:
            entries.append({"action": action, "addr": event.addr, "size": event.size,
                            "stream": event.stream, "time_us": int(event.t_us), "frames": []})
    with open_for_writing(path, binary=True) as out:
        pickle.dump({"segments": [], "device_traces": [entries]}, out)
    return sum(1 for entry in entries if entry["action"] != "free_requested")
