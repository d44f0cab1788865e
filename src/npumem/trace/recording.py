"""A PyTorch memory snapshot as a recording of one device: its trace, its settings, and the
allocator's state at the trace's first entry.

`torch.cuda.memory._record_memory_history()` keeps a ring buffer of the last N events, so a trace
usually starts mid-run, with weights, optimizer state and cached blocks already there. The
snapshot's `segments` are the state at the dump; walking the trace backwards from them undoes
its effects (an alloc un-allocates, a free re-allocates, segment_alloc/segment_free remove or
restore a segment) and gives the state at the first entry: which segments were reserved and
which blocks in them were live.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from ..alloc.torch_model.allocator import MIN_BLOCK, SMALL_BUFFER, SMALL_SIZE, round_size
from ..alloc.torch_model.config import TorchAllocatorConfig
from . import jsonl, safe_pickle
from .events import TraceFormatError
from .snapshot_schema import check_snapshot
from .textio import max_snapshot_bytes, read_bounded, read_head

SEGMENT_ADD = ("segment_alloc", "segment_map")
SEGMENT_REMOVE = ("segment_free", "segment_unmap")


@dataclass
class StartBlock:
    addr: int
    size: int
    requested: int
    allocated: bool
    frames: list = field(default_factory=list)


@dataclass
class StartSegment:
    addr: int
    size: int
    stream: int
    small: bool
    expandable: bool
    blocks: list[StartBlock] = field(default_factory=list)


@dataclass
class StartState:
    segments: list[StartSegment]
    live: dict[int, StartBlock]          # blocks live at the first entry, by address
    unplaced: int = 0                    # live blocks outside every start segment
    inconsistent: int = 0                # trace entries that contradict the segments

    @property
    def reserved(self) -> int:
        return sum(segment.size for segment in self.segments)

    @property
    def allocated(self) -> int:
        return sum(block.requested for block in self.live.values())


@dataclass
class Recording:
    path: str
    device: int
    flavour: str                         # "cuda" or "npu"
    settings: dict | None                # the snapshot's allocator_settings, if recorded
    segments: list[dict]                 # this device's segments at the dump
    entries: list[dict]                  # this device's trace entries
    annotations: list[dict] = field(default_factory=list)   # its external_annotations
    # A recording made up from another (a run played on past its end): it starts as that did
    continues: "Recording | None" = None

    @property
    def free_action(self) -> str:
        """Blocks become reusable at free_completed; old traces only have free_requested."""
        if any(entry.get("action") == "free_completed" for entry in self.entries):
            return "free_completed"
        return "free_requested"

    def recorded_segment_events(self) -> list[dict]:
        return [e for e in self.entries if e.get("action") in SEGMENT_ADD + SEGMENT_REMOVE]

    def start_state(self, config: TorchAllocatorConfig | None = None) -> StartState:
        if self.continues is not None:
            return self.continues.start_state(config)
        return rebuild_start(self, config or TorchAllocatorConfig(self.flavour))

    @classmethod
    def from_events(cls, path: str, events, flavour: str = "cuda") -> "Recording":
        """A trace without a snapshot's segments (JSONL, RMM, msprof, ...): it starts empty."""
        entries = []
        for event in events:
            action = "alloc" if event.action == "alloc" else "free_completed"
            entries.append({"action": action, "addr": event.addr, "size": event.size,
                            "stream": event.stream, "time_us": event.t_us})
        return cls(path, 0, flavour, None, [], entries)


def load_data(path: str) -> dict:
    """The snapshot's dict, read without running code (or from a JSONL file that holds a whole
    snapshot), its shape checked; TraceFormatError when it is not one."""
    if jsonl.holds_snapshot(read_head(path, 64)):
        return check_snapshot(jsonl.read_snapshot(path), path)
    try:
        data = safe_pickle.loads(read_bounded(path, max_snapshot_bytes()))
    except safe_pickle.UnsafePickleError as exc:
        raise TraceFormatError(path, "0", f"not a readable snapshot pickle: {exc}") from None
    return check_snapshot(data, path)


def _guess_flavour(data: dict, segments: list[dict], entries: list[dict]) -> str:
    settings = data.get("allocator_settings")
    if isinstance(settings, dict) and "PYTORCH_NPU_ALLOC_CONF" in settings:
        return "npu"
    for item in segments[:20] + entries[:200]:
        for frame in (item.get("frames") or [])[:12]:
            text = f"{frame.get('name', '')} {frame.get('filename', '')}"
            if "NPUCachingAllocator" in text or "torch_npu" in text or "c10_npu" in text:
                return "npu"
    return "cuda"


def load_recording(path: str, device: int | None = None, flavour: str | None = None) -> Recording:
    """One device of a snapshot (default: the first with trace entries, else with segments)."""
    return recording_from_data(load_data(path), path, device, flavour)


def recording_from_data(data: dict, path: str = "<snapshot>", device: int | None = None,
                        flavour: str | None = None) -> Recording:
    """One device of an already loaded snapshot dict."""
    traces = data.get("device_traces")
    traces = traces if isinstance(traces, list) else []
    segments = [s for s in data.get("segments", []) if isinstance(s, dict)]
    with_entries = [i for i, trace in enumerate(traces) if trace]
    with_segments = sorted({s.get("device", 0) for s in segments})
    if device is None:
        if not with_entries and not with_segments:
            raise TraceFormatError(path, "device_traces", "every device trace is empty and no "
                                   "segment is cached: the snapshot holds nothing")
        device = (with_entries or with_segments)[0]
    if device not in with_entries and device not in with_segments:
        raise TraceFormatError(path, "device_traces", f"no device {device}; devices with events: "
                               f"{with_entries}, with segments: {with_segments}")
    entries = traces[device] if device < len(traces) and isinstance(traces[device], list) else []
    mine = [s for s in segments if s.get("device", 0) == device]
    settings = data.get("allocator_settings")
    annotations = data.get("external_annotations")
    if not isinstance(annotations, list):
        annotations = []
    annotations = [annotation for annotation in annotations
                   if isinstance(annotation, dict) and annotation.get("device", device) == device]
    return Recording(path, device, flavour or _guess_flavour(data, mine, entries),
                     settings if isinstance(settings, dict) else None, mine, entries, annotations)


# --- rebuilding the state at the first entry ---------------------------------------------------

def _end_state(recording: Recording):
    ranges: dict[int, list] = {}       # address -> [size, stream, small, expandable]
    live: dict[int, StartBlock] = {}
    for segment in recording.segments:
        small = segment.get("segment_type") == "small"
        ranges[segment["address"]] = [segment["total_size"], int(segment.get("stream") or 0),
                                      small, bool(segment.get("is_expandable"))]
        for block in segment.get("blocks") or []:
            if isinstance(block, dict) and block.get("state", "inactive") != "inactive":
                live[block["address"]] = StartBlock(
                    block["address"], block["size"], block.get("requested_size") or block["size"],
                    True, block.get("frames") or [])
    return ranges, live


def _containing(ranges: dict[int, list], addr: int):
    for start, (size, *_rest) in ranges.items():
        if start <= addr < start + size:
            return start
    return None


def rebuild_start(recording: Recording, config: TorchAllocatorConfig) -> StartState:
    if not recording.segments and not recording.recorded_segment_events():
        return StartState([], {})     # allocs and frees only (a CPU recording): nothing before
    ranges, live = _end_state(recording)
    free_action = recording.free_action
    inconsistent = 0
    for entry in reversed(recording.entries):
        action, addr, size = entry["action"], entry.get("addr", 0), entry.get("size", 0)
        if action == "alloc":
            if live.pop(addr, None) is None:
                inconsistent += 1
        elif action == free_action:
            if addr in live:
                inconsistent += 1
            live[addr] = StartBlock(addr, 0, size, True, entry.get("frames") or [])
        elif action == "segment_alloc":
            if ranges.pop(addr, None) is None:
                inconsistent += 1
        elif action == "segment_free":
            ranges[addr] = [size, int(entry.get("stream") or 0), size == SMALL_BUFFER, False]
        elif action == "segment_map":
            start = _containing(ranges, addr)
            if start is None:
                inconsistent += 1
                continue
            total, stream, small, _ = ranges.pop(start)
            if addr > start:
                ranges[start] = [addr - start, stream, small, True]
            if addr + size < start + total:
                ranges[addr + size] = [start + total - addr - size, stream, small, True]
        elif action == "segment_unmap":
            stream = int(entry.get("stream") or 0)
            before = _containing(ranges, addr - 1)
            small = ranges[before][2] if before is not None else size % (20 << 20) != 0
            start, total = addr, size
            if before is not None and ranges[before][3]:
                total += ranges.pop(before)[0]
                start = before
            after = ranges.get(addr + size)
            if after is not None and after[3]:
                total += ranges.pop(addr + size)[0]
            ranges[start] = [total, stream, small, True]
    return _place_blocks(ranges, live, config, inconsistent)


def _place_blocks(ranges, live, config, inconsistent) -> StartState:
    """Lay the live blocks into their segments; the gaps between them are cached free blocks."""
    starts = sorted(ranges)
    by_segment: dict[int, list[StartBlock]] = {start: [] for start in starts}
    unplaced = 0
    for block in sorted(live.values(), key=lambda b: b.addr):
        index = bisect_right(starts, block.addr) - 1
        if index < 0 or block.addr >= starts[index] + ranges[starts[index]][0]:
            unplaced += 1
            continue
        by_segment[starts[index]].append(block)
    segments = []
    for start in starts:
        size, stream, small, expandable = ranges[start]
        end = start + size
        blocks, cursor = [], start
        placed = by_segment[start]
        for position, block in enumerate(placed):
            if block.addr < cursor:           # overlaps the block before it: drop it
                unplaced += 1
                continue
            if block.addr > cursor:
                blocks.append(StartBlock(cursor, block.addr - cursor, 0, False))
            limit = placed[position + 1].addr if position + 1 < len(placed) else end
            block.size = _start_block_size(block, limit, small, expandable, config)
            blocks.append(block)
            cursor = block.addr + block.size
        if cursor < end:
            blocks.append(StartBlock(cursor, end - cursor, 0, False))
        segments.append(StartSegment(start, size, stream, small, expandable, blocks))
    placed_live = {b.addr: b for s in segments for b in s.blocks if b.allocated}
    return StartState(segments, placed_live, unplaced, inconsistent)


def _start_block_size(block: StartBlock, limit: int, small: bool, expandable: bool,
                      config: TorchAllocatorConfig) -> int:
    """A block allocated before the trace: its rounded size, plus the rest of the gap when
    the allocator would not have split that rest off."""
    room = limit - block.addr
    if block.size:
        return min(block.size, room)
    size = min(round_size(block.requested, config), room)
    remaining = room - size
    if small or expandable:
        keep = remaining < MIN_BLOCK
    else:
        keep = size >= config.max_split_size or remaining <= SMALL_SIZE
    return room if keep else size
