"""What a snapshot says: the timeline, the peak and who held memory then, what was never freed,
and what grew between two snapshots. Works on npumem's snapshots and on PyTorch's.

A trace recorded mid-run starts with memory already in use that it never saw allocated; the
timeline is lifted so that it never goes below zero, and frees of unseen blocks are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..units import format_size
from .stacks import is_internal_file

_RESERVE = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass
class Point:
    time_us: float
    allocated: int
    reserved: int
    active: int


@dataclass
class SiteUsage:
    """Allocations from one site: how many, requested bytes, and the first one's callers."""

    where: str
    count: int = 0
    bytes: int = 0
    callers: list[str] = field(default_factory=list)


@dataclass
class DeviceAnalysis:
    device: int
    events: int = 0
    timeline: list[Point] = field(default_factory=list)
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_time_us: float = 0.0
    at_peak: list[SiteUsage] = field(default_factory=list)    # live at the allocated peak
    by_site: list[SiteUsage] = field(default_factory=list)    # all allocations in the trace


def user_frame(frames: list[dict]) -> dict | None:
    """The innermost Python frame outside npumem and torch (the user's line)."""
    for frame in frames:
        name = frame.get("filename", "")
        if name.endswith(".py") and not is_internal_file(name) and "/torch/" not in name:
            return frame
    return frames[0] if frames else None


def site_name(entry: dict) -> str:
    frame = user_frame(entry.get("frames") or [])
    if frame is not None:
        return f"{frame['filename']}:{frame['line']} in {frame['name']}"
    tag = entry.get("user_metadata")
    return f"[{tag}]" if tag else "(no stack recorded)"


def group_by_site(entries) -> list[SiteUsage]:
    """Trace entries grouped by allocation site, most requested bytes first."""
    sites: dict[str, SiteUsage] = {}
    for entry in entries:
        where = site_name(entry)
        site = sites.get(where)
        if site is None:
            frames = entry.get("frames") or []
            site = sites[where] = SiteUsage(where, callers=[
                f"{f['filename']}:{f['line']} in {f['name']}" for f in frames[1:8]])
        site.count += 1
        site.bytes += entry.get("requested_size") or entry["size"]
    return sorted(sites.values(), key=lambda s: (-s.bytes, s.where))


def analyze_trace(device: int, entries: list[dict]) -> DeviceAnalysis:
    result = DeviceAnalysis(device, events=len(entries))
    live: dict[int, dict] = {}
    allocated = reserved = active = 0
    points = []
    peak_index = peak_entry = -1
    for i, entry in enumerate(entries):
        action, size = entry.get("action"), entry.get("size", 0)
        if action == "alloc":
            live[entry["addr"]] = entry
            allocated += size
            active += size
        elif action == "free_requested":
            if live.pop(entry["addr"], None) is not None:
                allocated -= size
        elif action == "free_completed":
            active -= size
        elif action in _RESERVE:
            reserved += _RESERVE[action] * size
        else:
            continue
        points.append(Point(entry.get("time_us", 0), allocated, reserved, active))
        if action == "alloc" and (peak_index < 0 or allocated > points[peak_index].allocated):
            peak_index, peak_entry = len(points) - 1, i
    if points:                      # lift a trace that started with memory already in use
        low_alloc = min(0, min(p.allocated for p in points))
        low_reserved = min(0, min(p.reserved for p in points))
        low_active = min(0, min(p.active for p in points))
        for p in points:
            p.allocated -= low_alloc
            p.reserved -= low_reserved
            p.active -= low_active
            p.reserved = max(p.reserved, p.active)     # no segment events: reserved >= active
        result.peak_allocated = max(p.allocated for p in points)
        result.peak_reserved = max(p.reserved for p in points)
        if peak_index >= 0:
            result.peak_time_us = points[peak_index].time_us
    result.timeline = points
    result.at_peak = group_by_site(live_after(entries, peak_entry))
    result.by_site = group_by_site([e for e in entries if e.get("action") == "alloc"])
    return result


def live_after(entries: list[dict], last: int) -> list[dict]:
    """Blocks allocated and not yet freed after entries[last]."""
    live: dict[int, dict] = {}
    for entry in entries[:last + 1]:
        if entry.get("action") == "alloc":
            live[entry["addr"]] = entry
        elif entry.get("action") == "free_requested":
            live.pop(entry["addr"], None)
    return list(live.values())


def analyze_snapshot(snapshot: dict) -> list[DeviceAnalysis]:
    """One analysis per device that has trace events."""
    return [analyze_trace(device, entries)
            for device, entries in enumerate(snapshot.get("device_traces") or []) if entries]


def live_by_site(snapshot: dict) -> dict[str, int]:
    """Requested bytes of every block allocated at snapshot time, by allocation site."""
    sites: dict[str, int] = {}
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block.get("state") == "active_allocated":
                where = site_name(block)
                sites[where] = sites.get(where, 0) + (block.get("requested_size") or block["size"])
    return sites


def totals(snapshot: dict) -> tuple[int, int]:
    """(reserved, allocated) bytes in the snapshot's segments."""
    reserved = sum(s["total_size"] for s in snapshot["segments"])
    allocated = sum(b["size"] for s in snapshot["segments"] for b in s["blocks"]
                    if b.get("state") == "active_allocated")
    return reserved, allocated


def diff(before: dict, after: dict, limit: int = 20) -> str:
    """What grew (and shrank) between two snapshots, by allocation site."""
    a, b = live_by_site(before), live_by_site(after)
    changes = sorted(((b.get(k, 0) - a.get(k, 0), k) for k in set(a) | set(b)), reverse=True)
    changes = [(delta, where) for delta, where in changes if delta]
    (ra, aa), (rb, ab) = totals(before), totals(after)
    lines = [f"reserved  {format_size(ra):>12} -> {format_size(rb):>12}  ({_signed(rb - ra)})",
             f"allocated {format_size(aa):>12} -> {format_size(ab):>12}  ({_signed(ab - aa)})"]
    grew = [c for c in changes if c[0] > 0][:limit]
    shrank = sorted(c for c in changes if c[0] < 0)[:limit]
    lines.append(f"grew at {len([c for c in changes if c[0] > 0])} site(s):" if grew else
                 "nothing grew")
    lines += [f"  {_signed(delta):>14}  {where}  ({format_size(a.get(where, 0))} -> "
              f"{format_size(b.get(where, 0))})" for delta, where in grew]
    if shrank:
        lines.append(f"shrank at {len([c for c in changes if c[0] < 0])} site(s):")
        lines += [f"  {_signed(delta):>14}  {where}" for delta, where in shrank]
    return "\n".join(lines)


def _signed(nbytes: int) -> str:
    return ("+" if nbytes >= 0 else "-") + format_size(abs(nbytes))
