"""What a snapshot says: the timeline, the peak and who held memory then, what was never freed,
and what grew between two snapshots. Works on npumem's snapshots and on PyTorch's.

A trace recorded mid-run starts with memory already in use that it never saw allocated: the
timeline starts from the state rebuilt at its first entry (`trace.recording`), so peaks count
the memory that was live or cached before the trace, and blocks live then count at the peak.
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from dataclasses import dataclass, field

from ..trace.snapshot.columns import rows, take
from ..units import format_size
from .stacks import is_internal_file

_RESERVE = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass(slots=True)
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
class Request:
    """One allocation request of the trace: when, how much, from where (callers innermost
    first)."""

    time_us: float
    size: int
    where: str
    stack: list[str] = field(default_factory=list)


LARGEST = 200                       # allocations a report can point at on its timeline


@dataclass
class DeviceAnalysis:
    device: int
    events: int = 0
    timeline: list[Point] = field(default_factory=list)
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_time_us: float = 0.0
    peak_entry: int = -1                                      # index of the peak's alloc entry
    at_peak: list[SiteUsage] = field(default_factory=list)    # live at the allocated peak
    # Live at the peak by whole Python stack (outermost frame first) -> requested bytes.
    peak_stacks: dict[tuple[str, ...], int] = field(default_factory=dict)
    largest: list[Request] = field(default_factory=list)   # the biggest requests, for hover
    by_site: list[SiteUsage] = field(default_factory=list)    # all allocations in the trace
    # What the memory live at the peak was for (parameter, activation, ...), where the trace
    # says (the tensor recorder's categories): category -> requested bytes
    peak_categories: dict[str, int] = field(default_factory=dict)
    # live bytes by category over time: [(time_us, {category: bytes})], thinned for drawing
    category_timeline: list = field(default_factory=list)


# Frames of PyTorch's stack unwinder and allocator, which start every C++ stack in a snapshot.
_MACHINERY = ("torch::unwind", "CapturedTraceback", "gather_with_cpp", "CachingAllocator",
              "c10::", "at::detail::", "at::TensorBase", "empty_strided", "_PyEval", "PyObject_",
              "_Py", "cfunction_call", "method_vectorcall", "slot_tp_call")
_LIBRARIES = ("site-packages", "dist-packages", "torchinductor_", "/lib/python3", "<frozen")


def is_library(filename: str) -> bool:
    """A file of PyTorch, npumem or an installed library: not the user's own code."""
    return _framework(filename) or any(mark in filename for mark in _LIBRARIES)


def _framework(name: str) -> bool:
    return (is_internal_file(name) or "/torch/" in name or "/torch_npu/" in name
            or name.startswith(("torch/", "torch_npu/")))      # the profiler's short paths


def user_frame(frames: list[dict]) -> dict | None:
    """The innermost frame of the user's own code: a Python file outside npumem, torch and
    installed libraries; else outside npumem and torch; else the first C++ frame that is not
    PyTorch's unwinder or allocator."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    for frame in python:
        if not is_library(frame["filename"]):
            return frame
    for frame in python:
        if not _framework(frame["filename"]):
            return frame
    for frame in frames:
        if not any(mark in str(frame.get("name", "")) for mark in _MACHINERY):
            return frame
    return frames[0] if frames else None


def script_frames(frames: list[dict]) -> list[dict]:
    """The Python frames of `frames` (innermost first) up to where npumem's own runner
    (`npumem profile`) called the script."""
    python = []
    for frame in frames:
        name = str(frame.get("filename", ""))
        if is_internal_file(name) or name.startswith("npumem/"):
            break
        if name.endswith(".py"):
            python.append(frame)
    return python


def _frame_text(frame: dict) -> str:
    if frame.get("filename") == "<operator>":      # msprof: the operator is the site
        return str(frame.get("name"))
    return f"{frame.get('filename')}:{frame.get('line')} in {frame.get('name')}"


def callers(frames: list[dict], chosen: dict | None, limit: int = 16) -> list[str]:
    """The Python frames that called the chosen one, outermost last."""
    after = frames[frames.index(chosen) + 1:] if chosen in frames else frames
    return [_frame_text(frame) for frame in script_frames(after)[:limit]]


NO_STACK = "(no Python stack: recorded without stacks, or by a C++ thread such as autograd's)"


def site_name(entry: dict) -> str:
    frame = user_frame(entry.get("frames") or [])
    if frame is not None:
        return _frame_text(frame)
    tag = entry.get("user_metadata")
    return f"[{tag}]" if tag else NO_STACK


def group_by_site(entries) -> list[SiteUsage]:
    """Trace entries grouped by allocation site, most requested bytes first."""
    sites: dict[str, SiteUsage] = {}
    for entry in entries:
        where = site_name(entry)
        site = sites.get(where)
        if site is None:
            frames = entry.get("frames") or []
            site = sites[where] = SiteUsage(where, callers=callers(frames, user_frame(frames)))
        site.count += 1
        site.bytes += entry.get("requested_size") or entry["size"]
    return sorted(sites.values(), key=lambda s: (-s.bytes, s.where))


def analyze_trace(device: int, entries: list[dict], start_live: list[dict] = (),
                  start_reserved: int = 0) -> DeviceAnalysis:
    """`start_live` (entries of the blocks live at the first entry) and `start_reserved` are
    the state the trace began in. One walk over the entries' rows, a second to the peak; dicts
    are made only for what the report shows (live at the peak, the largest requests)."""
    result = DeviceAnalysis(device, events=len(entries))
    live: dict[int, int] = {entry["addr"]: entry["size"] for entry in start_live}
    allocated = active = sum(entry["size"] for entry in start_live)
    reserved = start_reserved
    timeline = _Timeline(len(entries))
    peak = None                                 # (allocated, time_us) at the highest alloc
    peak_entry = -1
    sites = _SiteCounter()
    largest: list[tuple[int, int]] = []         # (size, -index) of the largest requests
    for i, (action, addr, size, _, time_us, frames, extra, requested) in enumerate(rows(entries)):
        if action == "alloc":
            live[addr] = size
            allocated += size
            active += size
            sites.add(frames, extra, requested or size)
            if len(largest) < LARGEST:
                heapq.heappush(largest, (size, -i))
            elif size > largest[0][0]:
                heapq.heapreplace(largest, (size, -i))
            if peak is None or allocated > peak[0]:
                peak, peak_entry = (allocated, time_us), i
        elif action == "free_requested":
            if live.pop(addr, None) is not None:
                allocated -= size
        elif action == "free_completed":
            active -= size
        elif action in _RESERVE:
            reserved += _RESERVE[action] * size
        else:
            continue
        timeline.add(i, (time_us, allocated, reserved, active))
    points, (low_alloc, low_reserved, low_active), highs = timeline.finish()
    if points:                      # lift a trace that started with memory already in use
        for p in points:
            p.allocated -= low_alloc
            p.reserved -= low_reserved
            p.active -= low_active
            p.reserved = max(p.reserved, p.active)     # no segment events: reserved >= active
        result.peak_allocated = highs[0] - low_alloc
        result.peak_reserved = max(highs[1] - low_reserved, highs[2] - low_active)
        if peak is not None:
            result.peak_time_us = peak[1]
    result.timeline = points
    result.peak_entry = peak_entry
    live_at_peak = live_after(start_live, entries, peak_entry)
    result.at_peak = group_by_site(live_at_peak)
    result.peak_categories = by_category(live_at_peak)
    if result.peak_categories or any("category" in e for e in entries[:1000]):
        result.category_timeline = category_timeline(start_live, entries)
    result.peak_stacks = stacks_by_bytes(live_at_peak)
    result.by_site = sites.usage()
    chosen = take(entries, sorted(-index for _, index in largest))
    result.largest = [Request(e.get("time_us", 0), e.get("requested_size") or e.get("size", 0),
                              site_name(e), callers(e.get("frames") or [], None))
                      for e in sorted(chosen, key=lambda e: -e.get("size", 0))]
    return result


class _Timeline:
    """A device's timeline kept to what a chart can draw: of each stretch of entries (about
    BUCKETS stretches), its first and last points, its highest allocated, reserved and active,
    and its earliest and latest (a trace's clock need not rise in entry order). The lowest and
    highest values are kept over every point, for the lift and the peaks."""

    BUCKETS = 4096

    def __init__(self, entries: int):
        self.stride = max(1, entries // self.BUCKETS)
        self.end = self.stride
        self.stretch: list[tuple] = []
        self.points: list[Point] = []
        self.lows = [0, 0, 0]                       # min(0, lowest) allocated, reserved, active
        self.highs = [None, None, None]

    def add(self, index: int, point: tuple) -> None:
        if index >= self.end:
            self._close()
            self.end = (index // self.stride + 1) * self.stride
        self.stretch.append(point)

    def _close(self) -> None:
        stretch = self.stretch
        if not stretch:
            return
        chosen = {0, len(stretch) - 1}
        for field_ in (1, 2, 3):
            column = [p[field_] for p in stretch]
            low, high = min(column), max(column)
            self.lows[field_ - 1] = min(self.lows[field_ - 1], low)
            known = self.highs[field_ - 1]
            self.highs[field_ - 1] = high if known is None else max(known, high)
            chosen.add(column.index(high))
        times = [p[0] for p in stretch]
        chosen |= {times.index(min(times)), times.index(max(times))}
        self.points += [Point(*stretch[k]) for k in sorted(chosen)]
        self.stretch = []

    def finish(self) -> tuple[list[Point], list[int], list[int]]:
        self._close()
        return self.points, self.lows, [h or 0 for h in self.highs]


class _SiteCounter:
    """Requests and requested bytes by allocation site, the site found once per stack."""

    def __init__(self):
        self.sites: dict[str, SiteUsage] = {}
        self.known: dict[tuple[int, object], SiteUsage] = {}   # (id(frames), tag) -> its site
        self.kept: list = []                     # the stacks keyed by id, kept alive

    def add(self, frames, extra, nbytes: int) -> None:
        tag = extra.get("user_metadata")
        key = (id(frames), tag if isinstance(tag, str) else None)
        site = self.known.get(key)
        if site is None:
            entry = {"frames": frames, "user_metadata": tag}
            where = site_name(entry)
            site = self.sites.get(where)
            if site is None:
                stack = frames or []
                site = self.sites[where] = SiteUsage(where, callers=callers(
                    stack, user_frame(stack)))
            self.known[key] = site
            self.kept.append(frames)
        site.count += 1
        site.bytes += nbytes

    def usage(self) -> list[SiteUsage]:
        return sorted(self.sites.values(), key=lambda s: (-s.bytes, s.where))


CATEGORY_POINTS = 800                # points of a category timeline kept for drawing


def category_timeline(start_live: list[dict], entries) -> list[tuple[float, dict[str, int]]]:
    """Live bytes by category after each alloc and free, thinned to about CATEGORY_POINTS
    points (each kept point is the highest total of its stretch, so peaks stay). Two passes:
    the totals first, then the split by category at the points kept only."""
    def walk(at=None):
        live: dict = {}
        totals: dict[str, int] = {}
        total = 0
        every = itertools.chain(rows(start_live), rows(entries))
        for index, (action, addr, size, _, time_us, _, extra, _) in enumerate(every):
            if action == "alloc":
                kind = extra.get("category") or "other"
                live[addr] = (kind, size)
            elif action == "free_requested" and addr in live:
                kind, size = live.pop(addr)
                size = -size
            else:
                continue
            totals[kind] = totals.get(kind, 0) + size
            total += size
            if at is None:
                yield index, total
            elif index in at:
                yield time_us, dict(totals)

    points = list(walk())
    stride = max(1, len(points) // CATEGORY_POINTS)
    kept = {max(points[i:i + stride], key=lambda p: p[1])[0] for i in range(0, len(points), stride)}
    return list(walk(kept))


def by_category(entries: list[dict]) -> dict[str, int]:
    """Requested bytes by category, largest first; empty when no entry has one."""
    totals: dict[str, int] = {}
    for entry in entries:
        category = entry.get("category")
        if category:
            totals[category] = totals.get(category, 0) + (entry.get("requested_size")
                                                          or entry.get("size", 0))
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def stacks_by_bytes(entries: list[dict]) -> dict[tuple[str, ...], int]:
    """Requested bytes by Python stack, outermost frame first, from the script's first frame
    (npumem's runner and what called it are left out); entries without one go by site."""
    stacks: dict[tuple[str, ...], int] = {}
    for entry in entries:
        python = [_frame_text(frame) for frame in script_frames(entry.get("frames") or [])]
        key = tuple(reversed(python)) or (site_name(entry),)
        stacks[key] = stacks.get(key, 0) + (entry.get("requested_size") or entry.get("size", 0))
    return stacks


def live_after(start_live: list[dict], entries, last: int) -> list[dict]:
    """Blocks allocated and not yet freed after entries[last], `start_live` live before the
    first."""
    live: dict[int, object] = {entry["addr"]: entry for entry in start_live}
    for index, (action, addr, *_) in enumerate(rows(entries[:last + 1])):
        if action == "alloc":
            live[addr] = index
        elif action == "free_requested":
            live.pop(addr, None)
    made = iter(take(entries, [v for v in live.values() if isinstance(v, int)]))
    return [v if not isinstance(v, int) else next(made) for v in live.values()]


def start_of(snapshot: dict, device: int) -> tuple[list[dict], int]:
    """(entries standing for the blocks live at the trace's first entry, reserved bytes then);
    a window of a recording (profile/window.py) carries its own."""
    given = snapshot.get("npumem_start")
    if given and device in given:
        return given[device]
    try:
        state = start_state_of(snapshot, device)
    except (ValueError, KeyError, TypeError):      # unreadable entries: start from nothing
        return [], 0
    live = [{"action": "alloc", "addr": block.addr, "size": block.requested,
             "requested_size": block.requested, "frames": block.frames,
             "user_metadata": "" if block.frames else "allocated before the trace began"}
            for block in state.live.values()]
    return live, state.reserved


_STARTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def start_state_of(snapshot: dict, device: int, recording=None):
    """The state at the first entry of `device`'s trace (trace.snapshot.start_state.rebuild_start, a walk
    back over the whole trace), found once per trace read into columns however many parts of
    the report ask."""
    from ..trace.snapshot.columns import Entries
    from ..trace.snapshot import recording_from_data

    recording = recording or recording_from_data(snapshot, device=device)
    entries = recording.entries
    if not isinstance(entries, Entries):
        return recording.start_state()
    key = (device, entries.start, entries.stop, recording.flavour,
           tuple(id(segment) for segment in recording.segments))
    known = _STARTS.setdefault(entries.columns, {})
    if key not in known:
        known[key] = recording.start_state()
    return known[key]


def analyze_snapshot(snapshot: dict) -> list[DeviceAnalysis]:
    """One analysis per device that has trace events, from the state at its first entry."""
    return [analyze_trace(device, entries, *start_of(snapshot, device))
            for device, entries in enumerate(snapshot.get("device_traces") or []) if entries]


def _live_blocks(snapshot: dict) -> list[dict]:
    """The blocks allocated at snapshot time: from its segments, or for a trace without
    segments (JSONL, Chrome, RMM, ...) what its events left allocated."""
    if snapshot["segments"]:
        return [block for segment in snapshot["segments"] for block in segment["blocks"]
                if block.get("state") == "active_allocated"]
    return [entry for trace in snapshot.get("device_traces") or []
            for entry in live_after([], trace, len(trace) - 1)]


def live_by_site(snapshot: dict) -> dict[str, int]:
    """Requested bytes of every block allocated at snapshot time, by allocation site."""
    sites: dict[str, int] = {}
    for block in _live_blocks(snapshot):
        where = site_name(block)
        sites[where] = sites.get(where, 0) + (block.get("requested_size") or block["size"])
    return sites


def totals(snapshot: dict) -> tuple[int, int]:
    """(reserved, allocated) bytes at snapshot time (reserved is 0 without segments)."""
    reserved = sum(s["total_size"] for s in snapshot["segments"])
    return reserved, sum(block["size"] for block in _live_blocks(snapshot))


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
