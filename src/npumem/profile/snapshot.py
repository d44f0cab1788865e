"""PyTorch's memory snapshot structure, built from npumem's pools and a tracker (trace.snapshot
reads it back).

The structure is `torch.cuda.memory._snapshot()`'s (REFERENCE.md section 4), so PyTorch's
`python -m torch.cuda._memory_viz trace_plot|segment_plot|stats SNAPSHOT` reads what npumem
writes, and `npumem report` reads what PyTorch writes.
"""

from __future__ import annotations

import pickle
from bisect import bisect_left
from typing import Iterable

from ..trace.step_marks import NPUMEM_STEP
from .tracker import MemoryEvent, Tracker


def _frames(event: MemoryEvent | None) -> list[dict]:
    return [frame.as_dict() for frame in event.frames] if event is not None else []


def trace_entry(event: MemoryEvent, action: str, tracker: Tracker) -> dict:
    # npumem's oom event carries the device's free bytes as its address; PyTorch's oom entry
    # has them as device_free, in place of addr
    where = "device_free" if action == "oom" else "addr"
    entry = {"action": action, where: event.address, "size": event.size, "stream": event.stream,
             "time_us": int(tracker.wall_us(event.time_ns)), "frames": _frames(event)}
    if action == "alloc":
        entry["requested_size"] = event.requested
    if event.tag:
        entry["user_metadata"] = event.tag
    return entry


def device_traces(tracker: Tracker | None, devices: int = 0,
                  events: list[MemoryEvent] | None = None) -> list[list[dict]]:
    """The tracker's events (or those of it given) as PyTorch trace entries, one list per
    device index."""
    if events is None:
        events = tracker.events() if tracker is not None else []
    count = max([devices, *(event.device + 1 for event in events)])
    traces: list[list[dict]] = [[] for _ in range(count)]
    for event in events:
        for action in _entry_actions(event):
            traces[event.device].append(trace_entry(event, action, tracker))
    return traces


def _entry_actions(event: MemoryEvent) -> tuple[str, ...]:
    """The trace entries an event becomes: a free is requested, then completed, as PyTorch's."""
    return ("free_requested", "free_completed") if event.action == "free" else (event.action,)


def step_annotations(tracker: Tracker | None, events: list[MemoryEvent]) -> list[dict]:
    """Each `npumem.memory.step()` the tracker saw, as PyTorch's external annotations (a START
    of "npumem.memory.step" on the pool's device), with the index of the device's trace entry
    it came before (`npumem_entry`), which a replay marks the step at (trace.step_marks)."""
    if tracker is None:
        return []
    entry_times: dict[int, list[int]] = {}        # device -> each trace entry's time_ns
    for event in events:
        entry_times.setdefault(event.device, []).extend(
            [event.time_ns] * len(_entry_actions(event)))
    return [{"device": mark.device, "name": NPUMEM_STEP, "stage": "START",
             "time_us": int(tracker.wall_us(mark.start_ns)),
             "npumem_entry": bisect_left(entry_times.get(mark.device, []), mark.start_ns)}
            for mark in tracker.annotations() if mark.kind == "step"]


def pool_segments(pool, live_by_address: dict) -> list[dict]:
    """A pool's segments, each block carrying the frames of the allocation that holds it."""
    snap = pool.snapshot()
    for segment in snap["segments"]:
        segment["segment_pool"] = "pool"
        for block in segment["blocks"]:
            if block["state"] != "inactive":
                block["frames"] = _frames(live_by_address.get((pool.device, block["address"])))
    return snap["segments"]


def driver_segments(live: Iterable[MemoryEvent]) -> list[dict]:
    """Memory from the runtime's malloc: one segment holding one block each."""
    segments = []
    for event in live:
        if event.source != "driver":
            continue
        block = {"address": event.address, "size": event.size, "requested_size": event.requested,
                 "state": "active_allocated", "frames": _frames(event)}
        segments.append({
            "device": event.device, "address": event.address, "total_size": event.size,
            "allocated_size": event.size, "active_size": event.size,
            "requested_size": event.requested, "stream": event.stream, "segment_type": "large",
            "segment_pool": "driver", "is_expandable": False, "blocks": [block]})
    return segments


def build_snapshot(pools: Iterable, tracker: Tracker | None = None, devices: int = 0) -> dict:
    """{"segments": [...], "device_traces": [[...] per device]} for `pools` (and the driver
    allocations and event history `tracker` saw)."""
    live = tracker.live() if tracker is not None else []
    by_address = {(event.device, event.address): event for event in live if event.source == "pool"}
    segments = []
    for pool in pools:
        segments += pool_segments(pool, by_address)
    segments += driver_segments(live)
    segments.sort(key=lambda s: (s["device"], s["address"]))
    events = tracker.events() if tracker is not None else []
    snapshot = {"segments": segments, "device_traces": device_traces(tracker, devices, events)}
    annotations = step_annotations(tracker, events)
    if annotations:
        snapshot["external_annotations"] = annotations
    return snapshot


def save_snapshot(snapshot: dict, path) -> None:
    with open(path, "wb") as out:
        pickle.dump(snapshot, out)
