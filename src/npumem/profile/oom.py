"""An out-of-memory, explained: for a snapshot whose trace holds PyTorch's `oom` entry (taken
by an OOM observer, see docs/pytorch.md), what was asked, what was free, what was reserved but
unallocated, the largest cached block, and which settings would have avoided it.
"""

from __future__ import annotations

from ..units import format_size


def explain_oom(snapshot: dict, path: str = "<snapshot>") -> list[str]:
    """Lines for the report; [] when no device trace has an OOM."""
    from ..trace.recording import recording_from_data
    from ..trace.torch_replay import replay_recording
    from ..trace.torch_tune import tune_recording

    lines = []
    for device, entries in enumerate(snapshot.get("device_traces") or []):
        ooms = [i for i, e in enumerate(entries or []) if isinstance(e, dict) and e.get("action") == "oom"]
        if not ooms:
            continue
        try:
            recording = recording_from_data(snapshot, path, device)
            replayed = replay_recording(recording)
        except (ValueError, KeyError, TypeError) as exc:     # TraceFormatError included
            lines.append(f"device {device}: an out-of-memory at entry {ooms[0]}, but the trace "
                         f"cannot be replayed ({exc})")
            continue
        entry = entries[ooms[0]]
        capacity = replayed.capacity
        lines.append(f"device {device}: out of memory at trace entry {ooms[0]}: PyTorch asked "
                     f"for {format_size(entry.get('size', 0))} on stream {entry.get('stream', 0)} "
                     f"and the device had {format_size(entry.get('addr', 0))} free")
        oom = replayed.oom
        if oom is not None:
            lines.append(f"  at that moment PyTorch held {format_size(oom['reserved_bytes'])}: "
                         f"{format_size(oom['allocated_bytes'])} allocated, "
                         f"{format_size(oom['reserved_bytes'] - oom['allocated_bytes'])} reserved "
                         f"but unallocated; the largest cached free block was "
                         f"{format_size(oom['largest_free_bytes'])}, and the request needed a "
                         f"{format_size(oom['alloc_bytes'])} segment")
        if capacity is None:
            continue
        tuning = tune_recording(recording, capacity)
        fixes = [c for c in tuning.candidates if c.finishes and c is not tuning.recorded]
        if fixes:
            best = tuning.best
            lines.append(f"  with the {format_size(capacity)} PyTorch could use, the recording "
                         f"finishes under: " + "; ".join(c.config.describe() for c in fixes))
            lines.append(f"  set {best.line} (peak reserved "
                         f"{format_size(best.result.peak_reserved_bytes)})")
        else:
            lines.append(f"  no allocator setting avoids it on {format_size(capacity)}: the "
                         f"live tensors need the memory; free them earlier or shrink the batch")
    return lines
