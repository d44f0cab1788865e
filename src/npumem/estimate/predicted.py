"""The predicted run as a PyTorch snapshot: the fake run's requests placed by npumem's model of
the caching allocator, so that `npumem report`, `replay`, `tune`, `diff` and PyTorch's
MemoryViz open it like one `torch.cuda.memory._dump_snapshot` wrote on the GPU.

Each request becomes an `alloc` at the address the model gives it, each free a
`free_requested` and `free_completed`, and the model's cudaMalloc and cudaFree calls
`segment_alloc` and `segment_free` entries; `segments` is the model's state at the end, as
`segment_list()` gives it, with each live block's frames.
"""

from __future__ import annotations

from ..alloc.torch_model import TorchAllocatorModel
from ..alloc.torch_model.config import NO_LIMIT, TorchAllocatorConfig


def predicted_snapshot(recorded: dict, config: TorchAllocatorConfig) -> dict:
    traces, segments = [], []
    for device, trace in enumerate(recorded["device_traces"]):
        model = TorchAllocatorModel(config)
        placed, out = {}, []
        seen = 0
        for entry in trace:
            action = entry["action"]
            if action == "alloc":
                block = model.malloc(entry["size"], entry.get("stream", 0))
                placed[entry["addr"]] = (block, entry)
                seen = _segment_events(model, seen, out, entry)
                out.append({**entry, "addr": block.addr})
            elif action == "free_completed":
                found = placed.pop(entry["addr"], None)
                if found is None:
                    continue
                block, made = found
                freed = {**entry, "addr": block.addr, "frames": made.get("frames", []),
                         "size": made["size"]}
                out.append({**freed, "action": "free_requested"})
                model.free(block)
                out.append(freed)
            elif action == "segment_free":            # empty_cache()
                model.empty_cache()
                seen = _segment_events(model, seen, out, entry)
        traces.append(out)
        frames_at = {block.addr: made.get("frames", []) for block, made in placed.values()}
        for segment in model.segment_list():
            allocated = [b for b in segment["blocks"] if b["state"] == "active_allocated"]
            for block in allocated:
                block["frames"] = frames_at.get(block["address"], [])
            in_use = sum(b["size"] for b in allocated)
            segments.append({**segment, "device": device, "allocated_size": in_use,
                             "active_size": in_use,
                             "requested_size": sum(b["requested_size"] for b in segment["blocks"])})
    settings = {"PYTORCH_CUDA_ALLOC_CONF": config.text,
                "expandable_segments": config.expandable_segments,
                "garbage_collection_threshold": config.garbage_collection_threshold}
    if config.max_split_size != NO_LIMIT:
        settings["max_split_size"] = config.max_split_size
    return {"segments": segments, "device_traces": traces,
            "external_annotations": recorded.get("external_annotations", []),
            "allocator_settings": settings,
            "npumem": {**recorded.get("npumem", {}), "source": "npumem estimate (predicted)"}}


def _segment_events(model, seen: int, out: list, entry: dict) -> int:
    """The model's segment events since `seen`, as trace entries before `entry`'s."""
    events = model.stats.events
    for event in events[seen:]:
        if event.action == "oom":
            continue
        out.append({"action": event.action, "addr": event.addr, "size": event.size,
                    "stream": event.stream, "time_us": entry.get("time_us", 0), "frames": []})
    return len(events)
