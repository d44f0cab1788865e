"""/api/host: pinned host memory, which PyTorch 2.14 adds to a snapshot as `host_segments` and
`host_traces` when recorded with record_pinned_host_memory=True.

Their shape is the device's (docs/formats.md, "Pinned host memory", read from 2.14.1's compiled
`_memory_snapshot_pickled`): each host segment is a dict with the device segment's keys and one
block (a pinned allocation is its own segment); `host_traces` is one flat list of trace entries
with the device entries' keys. Still read defensively: a key missing or of the wrong type reads
as 0, and a list of lists (one per device, as `device_traces`) is accepted too.
"""

from __future__ import annotations

import math

from .source import Source

POINTS = 2000             # points of the host timeline, at most
SEGMENTS_SHOWN = 500


def host_memory(source: Source) -> dict:
    data = source.data
    segments = data.get("host_segments")
    traces = data.get("host_traces")
    if segments is None and traces is None:
        return {"host": False}
    segments = segments if isinstance(segments, list) else []
    entries = _entries(traces)
    shown = []
    for segment in segments[:SEGMENTS_SHOWN]:
        if not isinstance(segment, dict):
            continue
        blocks = segment.get("blocks") if isinstance(segment.get("blocks"), list) else []
        shown.append({
            "address": _int(segment.get("address")),
            "size": _int(segment.get("total_size", segment.get("size"))),
            "allocated": _int(segment.get("allocated_size")) or sum(
                _int(b.get("size")) for b in blocks if isinstance(b, dict)
                and str(b.get("state", "")).startswith("active")),
            "blocks": len(blocks),
            "keys": sorted(str(key) for key in segment)[:20]})
    return {"host": True, "segments": shown, "segment_count": len(segments),
            "reserved": sum(s["size"] for s in shown),
            "entries": len(entries), "timeline": _timeline(source, entries),
            "actions": sorted({str(e.get("action")) for e in entries})[:20],
            "shape": "2.14"}


def _entries(traces) -> list[dict]:
    """host_traces as one list of entry dicts (a list of entries, or one list per device)."""
    if not isinstance(traces, list):
        return []
    if traces and all(isinstance(t, list) for t in traces):
        return [e for trace in traces for e in trace if isinstance(e, dict)]
    return [e for e in traces if isinstance(e, dict)]


def _timeline(source: Source, entries: list[dict]) -> dict:
    """Allocated pinned bytes after each alloc and free, on the device timeline's axis where
    the entries carry times (else by entry number), thinned to POINTS."""
    t, level, total = [], [], 0
    actions = {str(e.get("action", "")) for e in entries}
    # a block is freed at free_requested where the trace records it (as on the device)
    frees = {"free_requested"} if "free_requested" in actions else {"free", "free_completed"}
    for number, entry in enumerate(entries):
        action = str(entry.get("action", ""))
        size = _int(entry.get("size"))
        if action == "alloc":
            total += size
        elif action in frees:
            total -= size
        else:
            continue
        when = entry.get("time_us")
        timed = (isinstance(when, (int, float)) and not isinstance(when, bool)
                 and math.isfinite(when))     # NaN or inf (a damaged file) cannot be drawn
        t.append(float(when) + source.offset if timed else number)
        level.append(total)
    if len(t) > POINTS:
        step = -(-len(t) // POINTS)
        keep = [max(range(i, min(i + step, len(t))), key=level.__getitem__)
                for i in range(0, len(t), step)]
        t, level = [t[i] for i in keep], [level[i] for i in keep]
    return {"t": t, "allocated": level}


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
