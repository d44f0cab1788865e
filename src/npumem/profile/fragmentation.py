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

from ..trace.snapshot.columns import rows
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
    return SegmentFragmentation(segment.get("device", 0), segment["address"], segment["total_size"],
                                allocated, free, largest, len(segment["blocks"]),
                                block_map(segment, width) if width else "")


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
    return [pools[device] for device in sorted(pools)]


def describe_free(pool: PoolFragmentation) -> str:
    """Where a pool's free bytes are: cached in empty segments, stranded in partly used ones."""
    return (f"{format_size(pool.cached)} cached in {pool.cached_segments} empty segment(s), "
            f"{format_size(pool.stranded)} stranded in partly used ones (largest piece "
            f"{format_size(pool.largest_stranded)}), fragmentation {pool.ratio:.3f}")


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
                         f"ratio {seg.ratio:.3f}")
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
    order. Built from the state at the first entry and the trace's segment and block events."""
    from ..trace.snapshot import recording_from_data
    from .analysis import start_state_of

    recording = recording_from_data(snapshot, device=device)
    entries = recording.entries
    if not entries:
        return []
    start = start_state_of(snapshot, device, recording)
    ranges = {segment.addr: segment.size for segment in start.segments}
    live = {block.addr: block.size for block in start.live.values()}
    pending: set[int] = set()
    allocated = sum(live.values())
    chosen = {round(i * (len(entries) - 1) / max(moments - 1, 1)) for i in range(moments)}
    if 0 <= also < len(entries):
        chosen.add(also)
    out = []
    for i, (action, addr, size, _, time_us, *_) in enumerate(rows(entries)):
        if action == "alloc":
            live[addr] = size
            allocated += size
        elif action == "free_requested" and addr in live and addr not in pending:
            pending.add(addr)                      # no longer the program's; not yet reusable
            allocated -= size
        elif action == "free_completed" and addr in live:
            if addr not in pending:
                allocated -= size
            del live[addr]
            pending.discard(addr)
        elif action in ("segment_alloc", "segment_map"):
            ranges[addr] = size
        elif action in ("segment_free", "segment_unmap"):
            _remove_range(ranges, addr, size)
        if i in chosen:
            out.append((time_us, allocated, _maps(ranges, live, pending, width, max_segments)))
    return out


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
