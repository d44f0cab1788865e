"""Fragmentation of a snapshot (npumem's or PyTorch's): per segment and per device pool.

free = bytes of inactive blocks; largest = the largest run of adjacent inactive blocks. A
segment's ratio = (free - largest) / free: 0 when its free memory is one piece, near 1 when it
is dust. A pool's free bytes are either cached (segments with nothing in them: whole, ready for
any request that fits, and given back by empty_cache) or stranded (free bytes in segments that
are partly in use); its fragmentation counts the stranded ones only: (stranded - the largest
stranded piece) / stranded.
A block map draws each segment as a row of cells: '#' allocated, '+' freed but pending (another
stream may still use it), '.' free, ':' a cell holding both live and free bytes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from ..trace.snapshot.columns import (ACTIONS, ALLOC, FREE_COMPLETED, FREE_REQUESTED,
                                      SEGMENT_ADD, SEGMENT_REMOVE, arrays, block_order, having,
                                      index_type, natural, sizes)
from ..alloc.torch_model import DEFAULT_POOL
from ..trace.snapshot import read_pool_id
from ..units import format_size

LIVE_STATES = ("active_allocated", "active_pending_free")


@dataclass
class SegmentFragmentation:
    device: int
    address: int
    size: int
    allocated: int
    free: int
    largest_free: int
    blocks: int
    map: str = ""
    pool: tuple | None = None          # a private pool's id (CUDA graph, MemPool); None: default

    @property
    def ratio(self) -> float:
        return (self.free - self.largest_free) / self.free if self.free else 0.0


@dataclass
class PoolFragmentation:
    device: int
    reserved: int = 0
    allocated: int = 0
    free: int = 0
    largest_free: int = 0
    cached: int = 0                    # free bytes in segments with nothing live
    cached_segments: int = 0
    stranded: int = 0                  # free bytes in segments partly in use
    largest_stranded: int = 0
    private: int = 0                   # free bytes in private pools' segments (of the above)
    private_segments: int = 0
    segments: list[SegmentFragmentation] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Fragmentation of the stranded bytes (cached whole segments are not fragmented)."""
        return (self.stranded - self.largest_stranded) / self.stranded if self.stranded else 0.0


def block_map(segment: dict, width: int) -> str:
    """`width` cells, each covering total_size / width bytes of the segment."""
    size = max(segment["total_size"], 1)
    live = [0.0] * width
    pending = [False] * width
    offset = segment["address"]
    for block in segment["blocks"]:
        start = block["address"] - offset
        end = start + block["size"]
        if block["state"] not in LIVE_STATES:
            continue
        first, last = start * width // size, min(width - 1, (end - 1) * width // size)
        for cell in range(first, last + 1):
            low, high = max(start, cell * size / width), min(end, (cell + 1) * size / width)
            live[cell] += max(0.0, high - low) / (size / width)
            pending[cell] |= block["state"] == "active_pending_free"
    return "".join("+" if p else "#" if f >= 0.999 else "." if f <= 0.001 else ":"
                   for f, p in zip(live, pending))


def analyze_segment(segment: dict, width: int = 64) -> SegmentFragmentation:
    free = largest = run = allocated = 0
    for block in sorted(segment["blocks"], key=lambda b: b["address"]):
        if block["state"] in LIVE_STATES:
            run = 0
            allocated += block["size"] if block["state"] == "active_allocated" else 0
        else:
            free += block["size"]
            run += block["size"]
            largest = max(largest, run)
    pool = read_pool_id(segment.get("segment_pool_id"))
    return SegmentFragmentation(segment.get("device", 0), segment["address"], segment["total_size"],
                                allocated, free, largest, len(segment["blocks"]),
                                block_map(segment, width) if width else "",
                                None if pool in (None, DEFAULT_POOL) else pool)


def analyze(snapshot: dict, width: int = 64) -> list[PoolFragmentation]:
    """One entry per device, segments sorted by address."""
    pools: dict[int, PoolFragmentation] = {}
    for segment in sorted(snapshot["segments"], key=lambda s: (s.get("device", 0), s["address"])):
        result = analyze_segment(segment, width)
        pool = pools.setdefault(result.device, PoolFragmentation(result.device))
        pool.segments.append(result)
        pool.reserved += result.size
        pool.allocated += result.allocated
        pool.free += result.free
        pool.largest_free = max(pool.largest_free, result.largest_free)
        if result.free == result.size:
            pool.cached += result.free
            pool.cached_segments += 1
        else:
            pool.stranded += result.free
            pool.largest_stranded = max(pool.largest_stranded, result.largest_free)
        if result.pool is not None:
            pool.private += result.free
            pool.private_segments += 1
    return [pools[device] for device in sorted(pools)]


def describe_free(pool: PoolFragmentation) -> str:
    """Where a pool's free bytes are: cached in empty segments, stranded in partly used ones."""
    private = (f"; {format_size(pool.private)} of it in {pool.private_segments} segment(s) of "
               f"private pools (CUDA graphs, MemPools): only their own pool reuses them, and "
               f"empty_cache() frees them once that pool is released" if pool.private_segments
               else "")
    return (f"{format_size(pool.cached)} cached in {pool.cached_segments} empty segment(s), "
            f"{format_size(pool.stranded)} stranded in partly used ones (largest piece "
            f"{format_size(pool.largest_stranded)}), fragmentation {pool.ratio:.3f}{private}")


def format_fragmentation(pools: list[PoolFragmentation], max_segments: int = 20) -> str:
    if not pools:
        return "No segments: nothing is reserved."
    lines = []
    for pool in pools:
        lines.append(f"device {pool.device}: reserved {format_size(pool.reserved)}, allocated "
                     f"{format_size(pool.allocated)}, free {format_size(pool.free)}: "
                     f"{describe_free(pool)}")
        worst = sorted(pool.segments, key=lambda s: (-s.ratio, -s.free))[:max_segments]
        for seg in sorted(worst, key=lambda s: s.address):
            lines.append(f"  0x{seg.address:x} {format_size(seg.size):>11} [{seg.map}] free "
                         f"{format_size(seg.free)}, largest {format_size(seg.largest_free)}, "
                         f"ratio {seg.ratio:.3f}"
                         + ("" if seg.pool is None else f", private pool {seg.pool}"))
        if len(pool.segments) > max_segments:
            lines.append(f"  ... {len(pool.segments) - max_segments} more segment(s), "
                         "the most fragmented are shown")
    lines.append("  map: '#' allocated, '+' pending free, '.' free, ':' both")
    return "\n".join(lines)


# --- the block map at chosen moments of the trace ----------------------------------------------

def maps_over_time(snapshot: dict, device: int, moments: int = 24, also: int = -1,
                   width: int = 64, max_segments: int = 40
                   ) -> list[tuple[float, int, list[tuple[int, int, str]]]]:
    """The device's segments at `moments` points of its trace (evenly spaced in entries) and
    after entry `also` (the peak, say): [(time_us, allocated, [(address, size, map)])], in time
    order. Built from the state at the first entry and the trace's segment and block events:
    an alloc makes its address live (with its size), a free_requested of a live block makes
    it pending (no longer the program's, not yet reusable) and a free_completed ends it."""
    from ..trace.snapshot import recording_from_data
    from .analysis import start_state_of

    recording = recording_from_data(snapshot, device=device)
    entries = recording.entries
    if not entries:
        return []
    start = start_state_of(snapshot, device, recording)
    ranges = {segment.addr: segment.size for segment in start.segments}
    chosen = {round(i * (len(entries) - 1) / max(moments - 1, 1)) for i in range(moments)}
    if 0 <= also < len(entries):
        chosen.add(also)
    chosen = np.array(sorted(chosen), dtype=np.int64)
    a = arrays(entries)
    first_live = {block.addr: block.size for block in start.live.values()}
    allocated, blocks = _blocks_at(a, first_live, chosen)
    segments = np.flatnonzero(having(a.action, *SEGMENT_ADD, *SEGMENT_REMOVE)).tolist()
    out, next_segment = [], 0
    for moment, total, (live, pending) in zip(chosen.tolist(), allocated, blocks):
        while next_segment < len(segments) and segments[next_segment] <= moment:
            at = segments[next_segment]
            next_segment += 1
            if ACTIONS[a.action[at]] in SEGMENT_ADD:
                ranges[int(a.addr[at])] = int(a.size[at])
            else:
                _remove_range(ranges, int(a.addr[at]), int(a.size[at]))
        out.append((float(a.time[moment]), total, _maps(ranges, live, pending, width,
                                                         max_segments)))
    return out




def _blocks_at(a, first_live: dict[int, int], moments: np.ndarray) -> tuple[list, list]:
    """(allocated bytes after each of the entries `moments`, and the blocks then as ({address:
    size}, {pending addresses})), `first_live` live before the first entry. Between two
    completed frees an address is free until an alloc, then live, then pending from the first
    free_requested on (the rule of maps_over_time, followed per address at once)."""
    positions, first, actions, addrs = block_order(a)
    n = len(positions)
    index = np.arange(n, dtype=index_type(n))
    # a block's life: from the first move of its address, or from just after a completed free
    begins = first.copy()
    begins[1:] |= actions[:-1] == FREE_COMPLETED
    begin = np.maximum.accumulate(np.where(begins, index, 0))
    del begins
    live = np.zeros(n, dtype=bool)           # the state each move finds: live,
    if first_live:                           # from an alloc, or from the start
        live[first] = np.isin(addrs[first], natural(list(first_live)))
        live = live[begin]
    allocating = actions == ALLOC
    live |= _earlier(allocating, begin)
    requested = actions == FREE_REQUESTED
    pending = _earlier(requested & live, begin)          # and pending
    size = sizes(a)[positions]
    change = np.where(allocating, size, np.where(live & ~pending, -size, 0))
    del size
    # allocated after each moment: the changes at or before it
    moment = np.searchsorted(moments, positions)         # the first moment each move counts in
    totals = np.zeros(len(moments) + 1, dtype=change.dtype)
    np.add.at(totals, moment, change)
    totals = (np.cumsum(totals)[:len(moments)] + sum(first_live.values())).tolist()
    del change
    # the state each move leaves holds until the next move of its address: the moments then
    live_after = allocating | (live & (actions != FREE_COMPLETED))
    pending_after = (pending | (requested & live)) & live_after
    last_alloc = np.maximum.accumulate(np.where(allocating, index, -1))
    shown = np.flatnonzero(live_after)
    following = np.minimum(shown + 1, max(n - 1, 0))
    until = np.where((shown + 1 < n) & ~first[following], positions[following], len(a))
    low, high = moment[shown], np.searchsorted(moments, until)
    blocks = [({}, set()) for _ in moments]
    covering = np.flatnonzero(high > low)
    for move, lo, hi in zip(shown[covering].tolist(), low[covering].tolist(),
                            high[covering].tolist()):
        addr = int(addrs[move])
        made = last_alloc[move]                  # the alloc that made the block, in this life
        nbytes = int(a.size[positions[made]]) if made >= begin[move] else first_live[addr]
        for k in range(lo, hi):
            blocks[k][0][addr] = nbytes
            if pending_after[move]:
                blocks[k][1].add(addr)
    # blocks live at the start that no move touches before a moment
    if first_live:
        touched = dict(zip(addrs[first].tolist(), positions[first].tolist()))
        for addr, nbytes in first_live.items():
            for k in range(np.searchsorted(moments, touched.get(addr, len(a)))):
                blocks[k][0][addr] = nbytes
    return totals, blocks


def _earlier(flags: np.ndarray, begin: np.ndarray) -> np.ndarray:
    """Whether a flag is set at an earlier move of the same life (`begin`: each move's first)."""
    before = np.cumsum(flags, dtype=begin.dtype)
    before -= flags
    return before > before[begin]


def _remove_range(ranges: dict[int, int], addr: int, size: int) -> None:
    """Take [addr, addr + size) out of the ranges (an unmap may cut a mapped range in two)."""
    for start, length in list(ranges.items()):
        end = start + length
        if start < addr + size and addr < end:
            del ranges[start]
            if start < addr:
                ranges[start] = addr - start
            if addr + size < end:
                ranges[addr + size] = end - addr - size


def _maps(ranges, live, pending, width: int, limit: int) -> list[tuple[int, int, str]]:
    blocks = sorted(live.items())
    starts = [addr for addr, _ in blocks]
    out = []
    for address, size in sorted(ranges.items())[:limit]:
        first = bisect.bisect_left(starts, address)
        inside = []
        for addr, length in blocks[first:]:
            if addr >= address + size:
                break
            inside.append({"address": addr, "size": length, "state": "active_pending_free"
                           if addr in pending else "active_allocated"})
        out.append((address, size, block_map({"address": address, "total_size": size,
                                               "blocks": inside}, width)))
    return out
