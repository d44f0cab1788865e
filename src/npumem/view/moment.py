"""/api/moment and /api/allocation: what is live after the last entry at or before a time, three
ways (by category, by stack as a flame graph, by segment as a block map), and one allocation.

Live blocks come from each alloc's end, kept sorted by entry (series.Lifetimes), so a moment is
a scan of the allocs before it, not a walk of the trace. Segments at a moment are the ones
reserved at the first entry (rebuilt from the dump, as the report does) changed by the segment
events before it: few, walked per request.
"""

from __future__ import annotations

import numpy as np

from ..trace.snapshot.columns import ACTION_CODE
from .series import OTHER, category_kinds
from .source import Source

CHILDREN = 12            # a flame node's children shown; the rest are summed into "other"
DEPTH = 32               # flame levels, at most
STACKS = 4000            # distinct stacks a flame is built from (the largest; the rest: other)
BLOCKS = 1000            # blocks listed per segment
SEGMENTS = 2000          # segments listed, at most
ALL_BLOCKS = 50_000      # blocks listed in all, at most (the answer stays a few MiB)
_ADD = {ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"]}
_REMOVE = {ACTION_CODE["segment_free"], ACTION_CODE["segment_unmap"]}
_MAP = ACTION_CODE["segment_map"]


def moment(source: Source, t: float) -> dict:
    s = source.series
    position = source.position_at(t)
    live, start_addrs = s.live_at(position) if s.n else (np.zeros(0, np.int64), [])
    a = source.a
    sizes = a.size[live].astype(np.int64)
    start_sizes = [int(s.start_live[addr]["size"]) for addr in start_addrs]
    total = int(sizes.sum()) + sum(start_sizes)
    asked = a.requested[live].astype(np.int64)
    asked = np.where(asked != 0, asked, sizes)          # (the report's requested_size or size)
    return {"t": t, "entry": position, "live_bytes": total,
            "live_count": len(live) + len(start_addrs),
            "by_category": _by_category(source, live, sizes, asked, sum(start_sizes)),
            "flame": _flame(source, live, sizes, start_addrs, total),
            "segments": _segments(source, position, live, start_addrs)}


def _by_category(source: Source, live, sizes, asked, start_bytes: int) -> list[dict]:
    """Live bytes by category (the blocks' sizes, which add up to the allocated total), and the
    bytes asked for (`requested`: what the report's "by category" lines count)."""
    a = source.a
    known = source.extras.get("category_kinds")
    if known is None:          # each distinct extra's category, once per source
        known = source.extras["category_kinds"] = category_kinds(a)
    index, kinds = known
    of = kinds[a.extra[live]]
    totals = np.bincount(of, weights=sizes, minlength=len(index)) if len(live) else \
        np.zeros(len(index))
    requested = np.bincount(of, weights=asked, minlength=len(index)) if len(live) else \
        np.zeros(len(index))
    out = {name: [int(totals[k]), int(requested[k])] for name, k in index.items()}
    if start_bytes:                  # (blocks live before the trace: their size is what was asked)
        row = out.setdefault(OTHER, [0, 0])
        row[0] += start_bytes
        row[1] += start_bytes
    return sorted(({"name": name, "bytes": n, "requested": asked_bytes}
                   for name, (n, asked_bytes) in out.items() if n),
                  key=lambda row: -row["bytes"])


# --- the flame graph ------------------------------------------------------------------------

def _path(source: Source, stack: int) -> tuple[str, ...]:
    """A stack's path from the root: the user's line first (the report's site), then the
    frames inside it (libraries, PyTorch) inward; then the callers are left out, as the site
    already names where the memory is asked for."""
    from ..profile.analysis import NO_STACK, _frame_text, site_name, user_frame

    known = source.extras.setdefault("flame_paths", {})
    path = known.get(stack)
    if path is None:
        frames = source.a.stacks[stack] or []
        chosen = user_frame(frames)
        inner = frames[:frames.index(chosen)] if chosen in frames else []
        python = [f for f in reversed(inner) if str(f.get("filename", "")).endswith(".py")]
        path = known[stack] = ((site_name({"frames": frames}) if frames else NO_STACK),
                               *(_frame_text(f) for f in python[:DEPTH - 1]))
    return path


def _flame(source: Source, live, sizes, start_addrs, total: int) -> dict:
    root = {"name": "all", "bytes": total, "children": {}}
    if len(live):
        stacks = source.a.stack_at(live)
        unique, inverse = np.unique(stacks, return_inverse=True)
        per_stack = np.bincount(inverse, weights=sizes)
        order = np.argsort(-per_stack)
        with source.lock:                  # (the path cache is shared by request threads)
            for k in order[:STACKS].tolist():
                _add(root, _path(source, int(unique[k])), int(per_stack[k]))
        rest = int(per_stack[order[STACKS:]].sum())
        if rest:
            _add(root, ("other stacks",), rest)
    start = sum(int(source.series.start_live[addr]["size"]) for addr in start_addrs)
    if start:
        _add(root, ("allocated before the trace began",), start)
    return _capped(root)


def _add(node: dict, path: tuple[str, ...], nbytes: int) -> None:
    for name in path:
        children = node["children"]
        child = children.get(name)
        if child is None:
            child = children[name] = {"name": name, "bytes": 0, "children": {}}
        child["bytes"] += nbytes
        node = child


def _capped(node: dict) -> dict:
    """The tree as lists, the CHILDREN largest children of each node, the rest as "other"."""
    children = sorted(node["children"].values(), key=lambda c: -c["bytes"])
    shown = [_capped(child) for child in children[:CHILDREN]]
    rest = sum(child["bytes"] for child in children[CHILDREN:])
    if rest:
        shown.append({"name": f"other ({len(children) - CHILDREN} more)", "bytes": rest,
                      "children": []})
    return {"name": node["name"], "bytes": node["bytes"], "children": shown}


# --- segments and their blocks ----------------------------------------------------------------

def _segments_at(source: Source, position: int) -> dict[int, list]:
    """Segments reserved after entry `position`: address -> [size, stream, pool, expandable]. An unmap
    cuts its range out of the mappings it covers (expandable segments map and unmap pages of
    one reservation, not whole segments)."""
    from ..profile.analysis import start_state_of

    state = source.extras.get("start_state")
    if state is None:
        state = source.extras["start_state"] = start_state_of(source.data, source.device,
                                                              source.recording)
    held = {seg.addr: [seg.size, seg.stream, list(seg.pool) if seg.pool else None,
                       seg.expandable] for seg in state.segments}
    a = source.a
    positions = source.series.segment_positions
    chosen = positions[:np.searchsorted(positions, position, "right")]
    for code, addr, size, stream, extra in zip(a.action[chosen].tolist(), a.addr[chosen].tolist(),
                                               a.size[chosen].tolist(), a.stream[chosen].tolist(),
                                               a.extra[chosen].tolist()):
        if code in _ADD:
            pool = a.extras[extra].get("pool_id") if isinstance(a.extras[extra], dict) else None
            held[addr] = [size, stream, list(pool) if isinstance(pool, (list, tuple)) else None,
                          code == _MAP]
        elif code in _REMOVE:
            _cut(held, addr, size)
    return held


def _cut(held: dict, addr: int, size: int) -> None:
    end = addr + size
    for start in [s for s, (n, *_) in held.items() if s < end and s + n > addr]:
        n, *rest = held.pop(start)
        if start < addr:
            held[start] = [addr - start, *rest]
        if start + n > end:
            held[end] = [start + n - end, *rest]


def _segments(source: Source, position: int, live, start_addrs) -> list[dict]:
    held = _segments_at(source, position) if position >= 0 or source.series.n else {}
    if not held:
        return []
    a, s = source.a, source.series
    inactive = s.inactive_at(position) if position >= 0 else np.zeros(0, np.int64)
    # every block in use: (address, size, state, alloc id), sorted by address
    addrs = np.r_[a.addr[live], a.addr[inactive],
                  np.array(start_addrs, dtype=np.uint64)].astype(np.uint64)
    block_sizes = np.r_[a.size[live], a.size[inactive],
                        np.array([s.start_live[x]["size"] for x in start_addrs],
                                 dtype=np.uint64)].astype(np.uint64)
    states = np.r_[np.zeros(len(live), np.int8), np.ones(len(inactive), np.int8),
                   np.zeros(len(start_addrs), np.int8)]
    ids = np.r_[live.astype(np.int64), inactive.astype(np.int64),
                np.full(len(start_addrs), -1, np.int64)]
    order = np.argsort(addrs, kind="stable")
    addrs, block_sizes, states, ids = addrs[order], block_sizes[order], states[order], ids[order]
    out, budget = [], ALL_BLOCKS
    for start, size, stream, pool in _merged(held)[:SEGMENTS]:
        first = int(np.searchsorted(addrs, np.uint64(start)))
        stop = int(np.searchsorted(addrs, np.uint64(start + size)))
        shown = min(stop, first + min(BLOCKS, budget))      # (a Python loop: bounded)
        budget -= shown - first
        blocks, cursor = [], start
        for at, n, state, alloc in zip(addrs[first:shown].tolist(),
                                       block_sizes[first:shown].tolist(),
                                       states[first:shown].tolist(), ids[first:shown].tolist()):
            if at > cursor:
                blocks.append({"offset": cursor - start, "size": at - cursor, "state": "free",
                               "alloc_id": None})
            blocks.append({"offset": at - start, "size": n,
                           "state": "inactive" if state else "allocated",
                           "alloc_id": alloc if alloc >= 0 else None})
            cursor = max(cursor, at + n)
        if shown == stop and cursor < start + size:
            blocks.append({"offset": cursor - start, "size": start + size - cursor,
                           "state": "free", "alloc_id": None})
        segment = {"address": start, "size": size, "stream": stream, "pool": pool,
                   "blocks": blocks}
        if stop > shown:
            segment["more_blocks"] = stop - shown
        out.append(segment)
    return out


def _merged(held: dict) -> list[tuple]:
    """(address, size, stream, pool) of each segment, by address; the adjacent mappings of one
    stream and pool (expandable segments' pages) as one segment."""
    out: list[list] = []
    for start in sorted(held):
        size, stream, pool, expandable = held[start]
        if out and out[-1][0] + out[-1][1] == start and out[-1][2:] == [stream, pool, True] \
                and expandable:
            out[-1][1] += size
        else:
            out.append([start, size, stream, pool, expandable])
    return [tuple(segment[:4]) for segment in out]


# --- one allocation ---------------------------------------------------------------------------

def allocation(source: Source, alloc: int) -> dict:
    from ..profile.analysis import site_name

    s, a = source.series, source.a
    end = s.end_of(alloc)                  # KeyError: not an alloc
    frames = a.stacks[int(a.stack_at(np.array([alloc]))[0])] or []
    extra = a.extras[int(a.extra[alloc])]
    extra = extra if isinstance(extra, dict) else {}
    requested = int(a.requested[alloc]) or int(a.size[alloc])
    return {"id": alloc, "size": int(a.size[alloc]), "requested": requested,
            "address": int(a.addr[alloc]), "stream": int(a.stream[alloc]),
            "t_alloc": float(source.t_of([alloc])[0]),
            "t_free": None if end is None else float(source.t_of([end])[0]),
            "category": extra.get("category"),
            "site": site_name({"frames": frames, "user_metadata": extra.get("user_metadata")}),
            "stack": [{"file": str(f.get("filename", "")), "line": f.get("line"),
                       "name": str(f.get("name", ""))} for f in frames]}
