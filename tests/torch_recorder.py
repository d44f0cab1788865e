"""Snapshots recorded from the allocator model, shaped like PyTorch's: a workload runs on
TorchAllocatorModel and every call becomes the trace entries c10 would record, with the ring
buffer keeping only the last `keep` entries (so the trace starts mid-run, as real ones do)."""

from __future__ import annotations

from npumem.alloc.torch_model import (DEFAULT_POOL, DeviceMemory, ModelOutOfMemory,
                                      TorchAllocatorModel, parse_config)


def record(workload, settings: str = "", capacity: int | None = None, keep: int | None = None,
           flavour: str = "cuda", entry_pool_ids: bool = False) -> dict:
    """`workload`: ("alloc", key, size[, stream]), ("free", key) and ("empty_cache"[, pool id])
    steps, and private pools' ("pool_create", id) (MemPool()), ("pool_begin", id[, streams]) (a
    capture of those streams; without: use_mem_pool, every stream), ("pool_end", id) and
    ("pool_release", id) (graph reset, MemPool deleted, use_mem_pool's exit). With pool steps
    segments carry segment_pool_id; `entry_pool_ids`: entries carry pool_id (newest PyTorch)."""
    config = parse_config(settings, flavour)
    model = TorchAllocatorModel(config, DeviceMemory(capacity, fresh_base=0x7F0000000000))
    entries, blocks = [], {}
    time_us = 0

    def add(action, addr, size, stream=0, frames=(), pool=DEFAULT_POOL):
        nonlocal time_us
        time_us += 1
        entries.append({"action": action, "addr": addr, "size": size, "stream": stream,
                        "time_us": time_us, "frames": list(frames)})
        if entry_pool_ids:
            entries[-1]["pool_id"] = pool

    for step in workload:
        before = len(model.stats.events)
        try:
            if step[0] == "alloc":
                stream = step[3] if len(step) > 3 else 0
                block = model.malloc(step[2], stream)
                blocks[step[1]] = block
            elif step[0] == "free" and step[1] in blocks:
                block = blocks.pop(step[1])
                add("free_requested", block.addr, block.requested, block.stream, pool=_pool(block))
                add("free_completed", block.addr, block.requested, block.stream, pool=_pool(block))
                model.free(block)
            elif step[0] == "empty_cache":
                model.empty_cache(*step[1:])
            elif step[0] == "pool_create":
                model.create_pool(step[1])
            elif step[0] == "pool_begin":
                model.begin_allocate_to_pool(step[1], step[2] if len(step) > 2 else None)
            elif step[0] == "pool_end":
                model.end_allocate_to_pool(step[1])
            elif step[0] == "pool_release":
                model.release_pool(step[1])
        except ModelOutOfMemory:
            for event in model.stats.events[before:]:
                add(event.action, event.addr, event.size, event.stream, pool=event.pool)
            oom = entries[-1]             # as c10 writes it: the driver's free bytes, no addr
            oom["device_free"] = oom.pop("addr")
            continue
        for event in model.stats.events[before:]:
            add(event.action, event.addr, event.size, event.stream, pool=event.pool)
        if step[0] == "alloc":
            add("alloc", block.addr, step[2], block.stream,
                [{"filename": "/home/user/train.py", "line": 10 + len(entries), "name": "step"}],
                pool=_pool(block))
    segments = []
    for segment in model.segment_list():
        segment.update(device=0, allocated_size=0, active_size=0, requested_size=0)
        if not any(str(step[0]).startswith("pool_") for step in workload):
            del segment["segment_pool_id"]          # as recorded before pools were modelled
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


def _pool(block) -> tuple:
    return DEFAULT_POOL if block.pool.owner is None else block.pool.owner.id
