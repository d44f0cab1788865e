"""`npumem report --window START:END`: a part of a long recording, read as if the recording began
at START with what was live then (the blocks allocated earlier and not yet freed, the memory
reserved), so that the window's peak and what made it are the whole run's figures there.

START and END are entry numbers of each device's trace (`1000000:2000000`, the first entry is
0), or times from the recording's first entry with a unit (`90s:120s`, `1500ms:`, `:2.5s`,
`250us:`); either may be left out. END is excluded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .analysis import _RESERVE, start_of

_UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6, "min": 60e6}
_BOUND = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|min)?\s*$")


class WindowError(ValueError):
    """A window that cannot be read or lies outside the recording; the message says which."""


@dataclass(frozen=True)
class Window:
    start: float | None         # entry number, or microseconds from the first entry
    end: float | None
    in_time: bool               # times (microseconds), not entry numbers
    text: str


def parse_window(text: str) -> Window:
    parts = text.split(":")
    if len(parts) != 2 or not any(p.strip() for p in parts):
        raise WindowError(f"{text!r} is not START:END (entry numbers such as 1000:5000, or times "
                          f"such as 90s:120s, 1500ms: or :2.5s)")
    bounds, units = [], set()
    for part in parts:
        if not part.strip():
            bounds.append(None)
            continue
        match = _BOUND.match(part)
        if match is None:
            raise WindowError(f"{part.strip()!r} in {text!r} is neither an entry number nor a "
                              f"time with a unit (us, ms, s, min)")
        number, unit = match.groups()
        if unit is None and "." in number:
            raise WindowError(f"{number!r} in {text!r}: an entry number is whole; a time needs "
                              f"a unit (us, ms, s, min)")
        units.add(unit is not None)
        bounds.append(float(number) * _UNITS[unit] if unit else int(number))
    if len(units) > 1:
        raise WindowError(f"{text!r} mixes an entry number with a time: give both as one kind")
    start, end = bounds
    if start is not None and end is not None and end <= start:
        raise WindowError(f"{text!r} ends where it starts or before: END must be after START")
    return Window(start, end, units.pop(), text)


def windowed(snapshot: dict, window: Window) -> dict:
    """The snapshot cut to `window`: each device's entries in it, the state each began in
    (`npumem_start`, which analysis.start_of reads), the step marks in it, and a note. The
    snapshot's segments are its end state: kept only when the window runs to the end
    (`npumem_window` tells the report so, and whether reserved bytes are known).
    The window's clock starts at the recording's first entry on any device, so that `--device`
    does not move it."""
    traces = snapshot.get("device_traces") or []
    held = [trace for trace in traces if trace]
    if not held:
        raise WindowError("the recording has no trace entries (device_traces) to cut a window "
                          "from")
    origin = min(trace[0].get("time_us", 0) for trace in held)
    cut, states, spans, descriptions = [], {}, {}, []
    for device, entries in enumerate(traces):
        if not entries:
            cut.append([])
            continue
        first, last = _span(entries, window, origin)
        live, reserved = start_of(snapshot, device)
        blocks = {entry["addr"]: entry for entry in live}
        for entry in entries[:first]:
            action = entry.get("action")
            if action == "alloc":
                blocks[entry["addr"]] = entry
            elif action == "free_requested":
                blocks.pop(entry.get("addr"), None)
            elif action in _RESERVE:
                reserved += _RESERVE[action] * entry.get("size", 0)
        states[device] = (list(blocks.values()), max(reserved, 0))
        spans[device] = (first, last)
        cut.append(entries[first:last])
        descriptions.append(f"device {device}: entries {first:,}–{last - 1:,} of {len(entries):,}"
                            if last > first else f"device {device}: no entries")
    if not any(cut):
        total = max(len(trace) for trace in held)
        length = max(trace[-1].get("time_us", 0) for trace in held) - origin
        raise WindowError(f"window {window.text} holds no entry: the recording has {total:,} "
                          f"entries over {_duration(length)}")
    whole = all(last == len(traces[device]) for device, (_, last) in spans.items())
    begins = min((traces[d][first].get("time_us", 0) for d, (first, last) in spans.items()
                  if last > first), default=origin) - origin
    note = (f"window {window.text} ({'; '.join(descriptions)}), starting with what was live "
            f"then; times here count from the window's start, {_duration(begins)} into the "
            f"recording")
    if not whole:
        note += "; 'still live' means at the window's end"
    reserved_known = bool(snapshot.get("segments")) or any(
        entry.get("action") in _RESERVE for trace in held for entry in trace)
    return {**snapshot, "device_traces": cut,
            "segments": (snapshot.get("segments") or []) if whole else [],
            "external_annotations": _annotations(snapshot, spans),
            "npumem_start": states,
            "npumem_window": {"end_state": whole, "reserved_known": reserved_known},
            "npumem_notes": [*(snapshot.get("npumem_notes") or []), note]}


def _span(entries: list[dict], window: Window, origin: float) -> tuple[int, int]:
    """[first, last) positions of the entries inside the window."""
    if not window.in_time:
        first = 0 if window.start is None else min(window.start, len(entries))
        last = len(entries) if window.end is None else min(window.end, len(entries))
        return first, max(first, last)
    times = [entry.get("time_us", 0) - origin for entry in entries]
    first = 0 if window.start is None else next(
        (i for i, t in enumerate(times) if t >= window.start), len(entries))
    last = len(entries) if window.end is None else next(
        (i for i, t in enumerate(times) if t >= window.end), len(entries))
    return first, max(first, last)


def _annotations(snapshot: dict, spans: dict) -> list[dict]:
    """Step marks placed by entry (npumem's) moved with their device's entries; others (by time
    only) kept when their time lies within the device's entries in the window."""
    traces = snapshot.get("device_traces") or []
    kept = []
    for mark in snapshot.get("external_annotations") or []:
        device = mark.get("device", 0)
        first, last = spans.get(device, (0, 0))
        if first >= last:
            continue
        if "npumem_entry" in mark:
            if first <= mark["npumem_entry"] <= last:
                kept.append({**mark, "npumem_entry": mark["npumem_entry"] - first})
        elif traces[device][first].get("time_us", 0) <= mark.get("time_us", 0) \
                <= traces[device][last - 1].get("time_us", 0):
            kept.append(mark)
    return kept


def _duration(us: float) -> str:
    return f"{us / 1e6:.3f} s" if us >= 1e5 else f"{us / 1e3:.3f} ms"
