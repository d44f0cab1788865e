"""An out-of-memory, explained: for a snapshot whose trace holds PyTorch's `oom` entry (taken
by an OOM observer, see docs/pytorch.md), what was asked, what the driver had free, what was
reserved but unallocated, the largest cached block, where in the program it happened, and
which settings would have avoided it.

Every command that reads a snapshot says this much (`oom_lines`); `npumem report` adds the
settings (`explain_oom`).
"""

from __future__ import annotations

from ..trace.snapshot import first_oom
from ..trace.snapshot.schema import oom_device_free
from ..units import format_size
from .analysis import NO_STACK, callers, is_library, site_name, user_frame


def oom_lines(recording, replayed=None) -> list[str]:
    """What the recording's first out-of-memory asked and what PyTorch held then; [] without
    one. `replayed`: the recording's replay under PyTorch's defaults, if already made."""
    from ..whatif.torch_replay import oom_facts

    return oom_lines_from(oom_facts(recording, replayed))


def oom_lines_from(facts: dict | None) -> list[str]:
    """oom_lines from what a replay found of the OOM (whatif.torch_replay.oom_facts)."""
    if not facts:
        return []
    index, entry, later, oom = facts["index"], facts["entry"], facts["later"], facts["model_oom"]
    lines = [f"out of memory at trace entry {index} of {facts['entries']}: PyTorch asked "
             f"for {format_size(entry.get('size', 0))} on stream {entry.get('stream', 0)}, and "
             f"the driver reported {format_size(oom_device_free(entry))} free on the device"
             + (f" ({later} more OOM entr{'y follows' if later == 1 else 'ies follow'})"
                if later else "")]
    if oom is not None and oom["index"] == index:
        lines.append(f"  PyTorch held {format_size(oom['reserved_bytes'])}: "
                     f"{format_size(oom['allocated_bytes'])} allocated, "
                     f"{format_size(oom['reserved_bytes'] - oom['allocated_bytes'])} reserved but "
                     f"unallocated; the largest cached block the request could use was "
                     f"{format_size(oom['largest_free_bytes'])}, and it needed a "
                     f"{format_size(oom['alloc_bytes'])} segment")
    frames = entry.get("frames") or []
    site = site_name(entry)
    if site != NO_STACK:
        lines.append(f"  at {site}")
        mine = [frame for frame in frames if not is_library(str(frame.get("filename", "")))]
        lines += [f"    called from {caller}" for caller in
                  callers(mine, user_frame(mine), limit=4)]
    else:
        lines.append("  no stack: record with torch.cuda.memory._record_memory_history("
                     "stacks='python') to see which line asked")
    return lines


def explain_oom(snapshot: dict, path: str = "<snapshot>") -> list[str]:
    """Lines for the report, one block per device that ran out; [] when none did."""
    from ..trace.snapshot import recording_from_data
    from ..whatif.torch_replay import replay_recording
    from ..whatif.torch_tune import tune_recording

    lines = []
    for device, entries in enumerate(snapshot.get("device_traces") or []):
        index = first_oom(entries)
        if index is None:
            continue
        try:
            recording = recording_from_data(snapshot, path, device)
            replayed = replay_recording(recording)
        except (ValueError, KeyError, TypeError) as exc:     # TraceFormatError included
            lines.append(f"device {device}: an out-of-memory at entry {index}, but the trace "
                         f"cannot be replayed ({exc})")
            continue
        described = oom_lines(recording, replayed)
        lines += [f"device {device}: {described[0]}", *described[1:]]
        if replayed.capacity is None:
            continue
        tuning = tune_recording(recording, workers=1)     # report may run in a profiled process
        lines += ["  " + line for line in tuning.answer_lines()]
    return lines
