"""Real GPU recordings, capped so that they run out of memory.

`capped(path, capacity)` is the snapshot an OOM observer would have dumped had the recorded run
had only `capacity` bytes: the recording's allocations and frees go through the model of the
allocator (exact on these recordings: `replay --check` MATCHes them) from the recording's start
state. The trace shows the model's segment events as c10 records them, then the `oom` entry as
PyTorch writes it (`device_free`, no `addr`). A `cap` of "fraction" stands for
set_per_process_memory_fraction on a larger device: `capacity` is the fraction's limit (c10's
allowed_memory_maximum, in bytes), and the driver still reports plenty free.

`truth(path, capacity, settings)` is whether the whole recorded run fits under those settings:
what a run on the GPU would show, since the whole run is known here.
"""

from __future__ import annotations

from npumem.alloc.torch_model import (DeviceMemory, ModelOutOfMemory, TorchAllocatorModel,
                                      from_snapshot, parse_config, round_size)
from npumem.trace.snapshot import load_recording
from npumem.whatif.torch_replay import plan_calls, replay_recording

DEVICE = 80 << 30            # the device behind a fraction cap (an H100's memory)


def _limits(capacity: int, cap: str) -> dict:
    """replay_recording's limits: the device's bytes, or a fraction's on a DEVICE-sized one."""
    if cap == "fraction":
        return {"capacity": DEVICE, "allowed": capacity}
    return {"capacity": capacity}


def _config(recording, settings: str):
    config = from_snapshot(recording.settings, recording.flavour)
    return parse_config(settings, base=config) if settings else config


def capped(path: str, capacity: int, cap: str = "device") -> dict | None:
    """The snapshot dumped at the OOM; None when the run fits in `capacity`."""
    recording = load_recording(path)
    config = _config(recording, "")
    limits = _limits(capacity, cap)
    model = TorchAllocatorModel(config, DeviceMemory(limits["capacity"], fresh_base=0x7E0000000000),
                                limits.get("allowed"))
    live = model.restore(recording.start_state(config).segments)
    trace: list[dict] = []

    def segment_events(before: int, time_us) -> None:
        for event in model.stats.events[before:]:
            if event.action != "oom":
                trace.append({"action": event.action, "addr": event.addr, "size": event.size,
                              "stream": event.stream, "time_us": time_us, "frames": []})

    calls, _ = plan_calls(recording)
    for _, call, entry in calls:
        before = len(model.stats.events)
        time_us = entry.get("time_us", 0)
        stream = int(entry.get("stream") or 0)
        if call == "empty_cache":
            model.empty_cache()
        elif call == "alloc":
            try:
                block = model.malloc(entry["size"], stream)
            except ModelOutOfMemory:
                segment_events(before, time_us)
                trace.append({"action": "oom", "device_free": model.device.free_bytes(),
                              "size": round_size(entry["size"], config), "stream": stream,
                              "time_us": time_us, "frames": entry.get("frames") or []})
                segments = [dict(s, device=0) for s in model.segment_list()]
                return {"segments": segments, "device_traces": [trace],
                        "allocator_settings": recording.settings}
            segment_events(before, time_us)
            live[entry["addr"]] = block
            trace.append({**entry, "addr": block.addr})
        elif call == "free":
            block = live.pop(entry["addr"], None)
            if block is None:
                continue
            for action in ("free_requested", "free_completed"):
                trace.append({**entry, "action": action, "addr": block.addr})
            model.free(block)
            segment_events(before, time_us)
    return None


def truth(path: str, capacity: int, settings: str, cap: str = "device") -> bool:
    """Whether the whole recorded run fits in `capacity` under `settings`."""
    recording = load_recording(path)
    return replay_recording(recording, _config(recording, settings),
                            **_limits(capacity, cap)).oom is None
