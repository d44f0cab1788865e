"""Snapshots recorded from the allocator model, shaped like PyTorch's: a workload runs on
TorchAllocatorModel and every call becomes the trace entries c10 would record, with the ring
buffer keeping only the last `keep` entries (so the trace starts mid-run, as real ones do)."""

from __future__ import annotations

from npumem.alloc.torch_model import (DeviceMemory, ModelOutOfMemory, TorchAllocatorModel,
                                      parse_config)


def record(workload, settings: str = "", capacity: int | None = None, keep: int | None = None,
           flavour: str = "cuda") -> dict:
    """`workload`: ("alloc", key, size[, stream]), ("free", key) and ("empty_cache",) steps."""
    config = parse_config(settings, flavour)
    model = TorchAllocatorModel(config, DeviceMemory(capacity, fresh_base=0x7F0000000000))
    entries, blocks = [], {}
    time_us = 0

    def add(action, addr, size, stream=0, frames=()):
        nonlocal time_us
        time_us += 1
        entries.append({"action": action, "addr": addr, "size": size, "stream": stream,
                        "time_us": time_us, "frames": list(frames)})

    for step in workload:
        before = len(model.stats.events)
        try:
            if step[0] == "alloc":
                stream = step[3] if len(step) > 3 else 0
                block = model.malloc(step[2], stream)
                blocks[step[1]] = block
            elif step[0] == "free" and step[1] in blocks:
                block = blocks.pop(step[1])
                add("free_requested", block.addr, block.requested, block.stream)
                add("free_completed", block.addr, block.requested, block.stream)
                model.free(block)
            elif step[0] == "empty_cache":
                model.empty_cache()
        except ModelOutOfMemory:
            for event in model.stats.events[before:]:
                add(event.action, event.addr, event.size, event.stream)
            oom = entries[-1]             # as c10 writes it: the driver's free bytes, no addr
            oom["device_free"] = oom.pop("addr")
            continue
        for event in model.stats.events[before:]:
            add(event.action, event.addr, event.size, event.stream)
        if step[0] == "alloc":
            add("alloc", block.addr, step[2], block.stream,
                [{"filename": "/home/user/train.py", "line": 10 + len(entries), "name": "step"}])
    segments = []
    for segment in model.segment_list():
        segment.update(device=0, allocated_size=0, active_size=0, requested_size=0)
        segments.append(segment)
    trace = entries[-keep:] if keep else entries
    settings_record = {"PYTORCH_CUDA_ALLOC_CONF": settings,
                       "max_split_size": -1 if config.max_split_size >= 1 << 63 else config.max_split_size,
                       "expandable_segments": config.expandable_segments,
                       "garbage_collection_threshold": config.garbage_collection_threshold,
                       "roundup_power2_divisions": {str(1 << i): v for i, v in
                                                    enumerate(config.roundup_power2_divisions)}}
    snapshot = {"segments": segments, "device_traces": [trace]}
    if flavour == "cuda":
        snapshot["allocator_settings"] = settings_record
    return snapshot
