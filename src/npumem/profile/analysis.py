"""What a snapshot says: the timeline, the peak and who held memory then, what was never freed,
and what grew between two snapshots. Works on npumem's snapshots and on PyTorch's.

A trace recorded mid-run starts with memory already in use that it never saw allocated: the
timeline starts from the state rebuilt at its first entry (`trace.recording`), so peaks count
the memory that was live or cached before the trace, and blocks live then count at the peak.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from ..trace.snapshot.columns import (ALLOC, FREE_COMPLETED, FREE_REQUESTED, SEGMENT_ADD,
                                      SEGMENT_REMOVE, arrays, block_order, exact, having,
                                      levels, natural, positions_where, sizes, take)
from ..units import format_size
from .stacks import is_internal_file

_RESERVE = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_POINT_ACTIONS = ("alloc", "free_requested", "free_completed", *_RESERVE)  # they move a total
TIMELINE_BUCKETS = 4096             # stretches of entries a timeline keeps a few points of


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
    the state the trace began in. The running totals are cumulative sums over the trace's
    columns; dicts are made only for what the report shows (live at the peak, the largest
    requests)."""
    a = arrays(entries)
    # events: a free once, though PyTorch records its request and its completion
    completions = np.count_nonzero(a.action == FREE_COMPLETED)
    requests = np.count_nonzero(a.action == FREE_REQUESTED) if completions else 0
    result = DeviceAnalysis(device, events=len(a) - int(requests))
    start = {entry["addr"]: entry["size"] for entry in start_live}
    base = sum(entry["size"] for entry in start_live)
    action, size = a.action, sizes(a)
    allocating = action == ALLOC
    allocs = np.flatnonzero(allocating)
    points = positions_where(having(action, *_POINT_ACTIONS))
    every = len(points) == len(a)
    at = slice(None) if every else points
    # allocated: + each alloc, - each free_requested of a block live then (by the free's size)
    added = np.where(allocating, size, 0)
    change = added.copy()
    freed, _ = _frees_of_live(a, start)
    change[freed] = -size[freed]
    running = np.cumsum(change, out=change)
    peak_entry = int(allocs[np.argmax(running[allocs])]) if len(allocs) else -1
    allocated = running[at]
    allocated += base
    # active: + each alloc, - each free_completed
    active = np.cumsum(np.where(action == FREE_COMPLETED, -size, added), out=added)[at]
    active += base
    del change, running, added
    # reserved: moves at the segment entries only
    segments = np.flatnonzero(having(action, *SEGMENT_ADD, *SEGMENT_REMOVE))
    reserved = levels(start_reserved, np.where(having(action[segments], *SEGMENT_ADD),
                                               size[segments], -size[segments]),
                      segments, len(a))[at]
    times = a.time[at]
    if len(points):                 # lift a trace that started with memory already in use
        lows = [min(0, int(values.min())) for values in (allocated, reserved, active)]
        highs = [int(values.max()) for values in (allocated, reserved, active)]
        kept = _thinned(points, len(entries), times, (allocated, reserved, active)).tolist()
        result.timeline = [Point(t, p - lows[0], max(r - lows[1], c - lows[2]), c - lows[2])
                           for t, p, r, c in zip(times[kept].tolist(), allocated[kept].tolist(),
                                                 reserved[kept].tolist(), active[kept].tolist())]
        result.peak_allocated = highs[0] - lows[0]
        result.peak_reserved = max(highs[1] - lows[1], highs[2] - lows[2])
        if peak_entry >= 0:         # the first alloc that reached the highest allocated
            result.peak_time_us = float(a.time[peak_entry])
    del allocated, reserved, active, times
    result.peak_entry = peak_entry
    live_at_peak = live_after(start_live, entries, peak_entry)
    result.at_peak = group_by_site(live_at_peak)
    result.peak_categories = by_category(live_at_peak)
    if result.peak_categories or any("category" in e for e in entries[:1000]):
        result.category_timeline = category_timeline(start_live, entries)
    result.peak_stacks = stacks_by_bytes(live_at_peak)
    requested = a.requested[allocs]
    result.by_site = _site_usage(a, allocs, np.where(requested != 0, requested, a.size[allocs]))
    chosen = take(entries, sorted(_largest(allocs, a.size[allocs]).tolist()))
    result.largest = [Request(e.get("time_us", 0), e.get("requested_size") or e.get("size", 0),
                              site_name(e), callers(e.get("frames") or [], None))
                      for e in sorted(chosen, key=lambda e: -e.get("size", 0))]
    return result


def _frees_of_live(a, start) -> tuple[np.ndarray, np.ndarray]:
    """(positions of the free_requested entries of a block live then, the position of the
    alloc that made each one, -1 for a block of `start`, live before the first entry)."""
    positions, first, actions, addrs = block_order(a, ("alloc", "free_requested"))
    after_alloc = np.zeros(len(positions), dtype=bool)
    after_alloc[1:] = actions[:-1] == ALLOC
    after_alloc &= ~first
    if start:
        after_alloc |= first & np.isin(addrs, natural(list(start)))
    ends = np.flatnonzero((actions == FREE_REQUESTED) & after_alloc)
    return positions[ends], np.where(first[ends], -1, positions[ends - 1])


def _thinned(positions: np.ndarray, entries: int, times: np.ndarray, totals) -> np.ndarray:
    """Which points a chart keeps (indices into `positions`, the points' entry positions): of
    each stretch of about entries / TIMELINE_BUCKETS entries, its first and last points, the
    first highest of each of `totals`, and the first earliest and latest (a trace's clock need
    not rise in entry order)."""
    stretch = positions // max(1, entries // TIMELINE_BUCKETS)
    begins = np.empty(len(positions), dtype=bool)
    begins[0] = True
    begins[1:] = stretch[1:] != stretch[:-1]
    del stretch
    starts = np.flatnonzero(begins)
    run = np.cumsum(begins, dtype=positions.dtype)   # each point's stretch, numbered from 0
    run -= 1
    chosen = [starts, np.r_[starts[1:], len(positions)] - 1,
              _first_extreme(times, starts, run, np.minimum),
              _first_extreme(times, starts, run, np.maximum)]
    chosen += [_first_extreme(values, starts, run, np.maximum) for values in totals]
    return np.unique(np.concatenate(chosen))


def _first_extreme(values: np.ndarray, starts: np.ndarray, run: np.ndarray, extreme) -> np.ndarray:
    """The index of the first lowest (np.minimum) or highest (np.maximum) value of each run of
    `values` (runs begin at `starts`; `run`: each value's run)."""
    at = np.arange(len(values), dtype=run.dtype)
    at[values != extreme.reduceat(values, starts)[run]] = len(values)
    return np.minimum.reduceat(at, starts)


def _largest(allocs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The LARGEST allocs by size (of equal sizes, the earliest)."""
    if len(allocs) > LARGEST:
        least = np.partition(sizes, len(sizes) - LARGEST)[len(sizes) - LARGEST]
        allocs, sizes = allocs[sizes >= least], sizes[sizes >= least]
    return allocs[np.lexsort((-allocs, sizes))[::-1][:LARGEST]]


def _site_usage(a, allocs: np.ndarray, nbytes: np.ndarray) -> list[SiteUsage]:
    """Requests and requested bytes by allocation site, most bytes first. The site is found
    once per (stack, user_metadata) pair, the callers from the first request of each site."""
    tags = [extra.get("user_metadata") for extra in a.extras] if len(allocs) else []
    tag_ids: dict = {}
    tag_of = np.array([tag_ids.setdefault(tag if isinstance(tag, str) else None, len(tag_ids))
                       for tag in tags], dtype=np.int64)
    keys = a.stack[allocs].astype(np.int64) * max(len(tag_ids), 1) + tag_of[a.extra[allocs]]
    counts, first, totals = _tally(keys, exact(nbytes))
    sites: dict[str, SiteUsage] = {}
    used = np.flatnonzero(counts)
    for key in used[np.argsort(first[used])].tolist():       # in order of first request
        entry = allocs[first[key]]
        frames = a.stacks[a.stack[entry]]
        where = site_name({"frames": frames, "user_metadata": tags[a.extra[entry]]})
        site = sites.get(where)
        if site is None:
            stack = frames or []
            site = sites[where] = SiteUsage(where, callers=callers(stack, user_frame(stack)))
        site.count += int(counts[key])
        site.bytes += int(totals[key])
    return sorted(sites.values(), key=lambda s: (-s.bytes, s.where))


def _tally(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, first index, sum of `values`) of each key (non-negative integers; a key never
    seen counts 0), without sorting unless the keys are sparse."""
    if len(keys) and keys.max() > 4 * len(keys):
        _, keys = np.unique(keys, return_inverse=True)
    counts = np.bincount(keys)
    first = np.full(len(counts), len(keys))
    np.minimum.at(first, keys, np.arange(len(keys)))
    sums = np.zeros(len(counts), dtype=values.dtype)
    np.add.at(sums, keys, values)
    return counts, first, sums


CATEGORY_POINTS = 800                # points of a category timeline kept for drawing


def category_timeline(start_live: list[dict], entries) -> list[tuple[float, dict[str, int]]]:
    """Live bytes by category after each alloc and free of a live block, thinned to about
    CATEGORY_POINTS points (each kept point is the highest total of its stretch, so peaks
    stay); the blocks of `start_live` come first, as allocs."""
    a, first = arrays(entries), arrays(start_live)
    kinds: dict[str, int] = {}

    def kind_ids(extras) -> np.ndarray:
        return np.array([kinds.setdefault(extra.get("category") or "other", len(kinds))
                         for extra in extras], dtype=np.int64)

    start_kind, extra_kind = kind_ids(first.extras), kind_ids(a.extras)
    row_of = {addr: row for row, addr in enumerate(first.addr.tolist())}   # the last row's
    freed, owners = _frees_of_live(a, row_of)
    allocs = np.flatnonzero(a.action == ALLOC)
    moves, owner = np.r_[allocs, freed], np.r_[allocs, owners]   # and the alloc of each block
    order = np.argsort(moves)
    moves, owner = moves[order], owner[order]
    from_start = owner < 0                       # frees of a block of start_live
    rows = np.array([row_of[addr] for addr in a.addr[moves[from_start]].tolist()], dtype=np.int64)
    kind = extra_kind[a.extra[owner]] if len(moves) else owner
    kind[from_start] = start_kind[rows]
    size = sizes(a)[owner]
    size[from_start] = exact(first.size)[rows]
    change = np.r_[exact(first.size), np.where(a.action[moves] == ALLOC, size, -size)]
    kind = np.r_[start_kind, kind]
    times = np.r_[first.time, a.time[moves]]
    total = np.cumsum(change)
    stride = max(1, len(total) // CATEGORY_POINTS)
    starts = np.arange(0, len(total), stride)
    kept = (_first_extreme(total, starts, np.arange(len(total)) // stride, np.maximum)
            if len(total) else starts)
    names = list(kinds)
    series = []                                  # (kind, its moves, their running total)
    for k in np.unique(kind).tolist():
        mine = np.flatnonzero(kind == k)
        series.append((names[k], mine, np.cumsum(change[mine])))
    series.sort(key=lambda item: item[1][0])     # as a dict of kinds: in order of appearance
    return [(float(times[point]), {name: int(sums[np.searchsorted(mine, point, "right") - 1])
                                   for name, mine, sums in series if mine[0] <= point})
            for point in kept.tolist()]


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
    first: in the order a dict of them by address would hold them."""
    start = {entry["addr"]: entry for entry in start_live}
    addrs, allocs = live_blocks(arrays(entries), last + 1, ("free_requested",), start)
    made = iter(take(entries, allocs[allocs >= 0]))
    return [start[addr] if at < 0 else next(made)
            for addr, at in zip(addrs.tolist(), allocs.tolist())]


def live_blocks(a, stop: int, frees: tuple[str, ...], start=()) -> tuple[np.ndarray, np.ndarray]:
    """The blocks live before entry `stop` as (addresses, the position of each one's last
    alloc, -1 for a block of `start` not allocated since), in the order of a dict that an
    alloc sets (at its address) and any of `frees` pops, holding the addresses of `start`
    first: an address keeps its place until it is freed, and is placed again at the first
    alloc after its last free."""
    positions, first, actions, addrs = block_order(a, ("alloc", *frees), stop)
    freeing = actions != ALLOC
    begins = np.flatnonzero(first)
    ends = np.r_[begins[1:], len(positions)][:len(begins)] - 1
    addrs = addrs[begins]
    last_free = (np.maximum.reduceat(np.where(freeing, np.arange(len(positions)), -1), begins)
                 if len(begins) else begins)
    live = ~freeing[ends]                          # the address's last move is an alloc
    started = natural(list(start))
    rank = np.full(len(begins), -1)                # the address's place in `start` (or -1)
    if len(started):
        order = np.argsort(started, kind="stable")
        found = np.minimum(np.searchsorted(started[order], addrs), len(started) - 1)
        hit = started[order][found] == addrs
        rank[hit] = order[found[hit]]
    # a live block keeps its place in `start` while the trace never frees its address, and
    # else takes the place of its first alloc after the last free
    keeps_start = live & (last_free < 0) & (rank >= 0)
    by_trace = live & ~keeps_start
    placed_at = positions[np.where(last_free >= 0, last_free + 1, begins)[by_trace]]
    untouched = np.ones(len(started), dtype=bool)  # blocks of `start` the trace never moves
    untouched[rank[rank >= 0]] = False
    start_rows = np.r_[np.flatnonzero(untouched), rank[keeps_start]]
    out_addrs = np.r_[started[start_rows], addrs[by_trace]]
    out_allocs = np.r_[np.full(untouched.sum(), -1), positions[ends[keeps_start]],
                       positions[ends[by_trace]]]
    order = np.r_[np.argsort(start_rows, kind="stable"),
                  len(start_rows) + np.argsort(placed_at, kind="stable")]
    return out_addrs[order], out_allocs[order]


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
    """The blocks and segments at the first entry of `device`'s trace (rebuild_start, a walk
    back over the whole trace, without the pools, which the report does not show), found once
    per trace read into columns however many parts of the report ask."""
    from ..trace.snapshot.columns import Entries
    from ..trace.snapshot import recording_from_data

    recording = recording or recording_from_data(snapshot, device=device)
    entries = recording.entries
    if not isinstance(entries, Entries):
        return recording.start_state(pools=False)
    key = (device, entries.start, entries.stop, recording.flavour,
           tuple(id(segment) for segment in recording.segments))
    known = _STARTS.setdefault(entries.columns, {})
    if key not in known:
        known[key] = recording.start_state(pools=False)
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
