"""Chrome trace JSON (the Trace Event Format Perfetto and chrome://tracing open).

One process per device: counter tracks "memory" (allocated, reserved, active bytes) and
"host" (resident set size from the sampler), instant events for each alloc and free, and op
slices on one track per stream. User ranges and marks go on the thread that made them. Kernel
launches add a process per device of modelled AI core lanes ("core 3 MTE2"), placed at the
launch's start.

Stream handles and host thread ids are far above 2**31, where viewers truncate them and fold
every track into one: each track gets a small tid instead, and a thread_name that names the
stream or thread.
"""

from __future__ import annotations

import json

from ..units import format_size
from .sampler import Sample
from .tracker import MemoryEvent, Tracker

HOST_PID = 0


AICORE_PID = 1000       # + device: the modelled AI core timelines of kernel launches


def _pid(device: int) -> int:
    return device + 1 if device >= 0 else HOST_PID


def chrome_events(tracker: Tracker, samples: list[Sample] = ()) -> list[dict]:
    return list(iter_chrome_events(tracker, samples))


def iter_chrome_events(tracker: Tracker, samples: list[Sample] = ()):
    """The trace's events one at a time, so a million of them are written without a list."""
    start = tracker.started_ns

    def ts(time_ns: int) -> float:
        return round((time_ns - start) / 1e3, 3)

    yield {"ph": "M", "name": "process_name", "pid": HOST_PID, "args": {"name": "host"}}
    devices = set()
    tracks: dict[tuple[int, int], int] = {}         # (pid, stream handle or thread id) -> tid

    def track(pid: int, raw: int) -> int:
        return tracks.setdefault((pid, raw), 1 + sum(1 for p, _ in tracks if p == pid))

    memory: list[MemoryEvent] = tracker.events()
    for event in memory:
        pid = _pid(event.device)
        devices.add(event.device)
        yield {"ph": "C", "name": "memory", "pid": pid, "ts": ts(event.time_ns),
               "args": {"allocated": event.allocated, "reserved": event.reserved,
                        "active": event.active}}
        if event.action in ("alloc", "free", "free_requested", "oom"):
            args = {"address": f"0x{event.address:x}", "bytes": event.size,
                    "requested": event.requested, "stream": event.stream, "source": event.source}
            if event.tag:
                args["tag"] = event.tag
            if event.frames:
                args["stack"] = [str(frame) for frame in event.frames]
            yield {"ph": "i", "s": "t", "pid": pid, "tid": track(pid, event.stream),
                   "ts": ts(event.time_ns), "cat": "memory",
                   "name": f"{event.action} {format_size(event.requested)}", "args": args}
    for annotation in tracker.annotations():
        if annotation.kind == "op":
            pid = _pid(annotation.device)
            devices.add(annotation.device)
        else:
            pid = HOST_PID
        tid = track(pid, annotation.thread)
        if annotation.kind == "mark":
            yield {"ph": "i", "s": "p", "pid": pid, "tid": tid, "name": annotation.name,
                   "ts": ts(annotation.start_ns), "cat": "mark"}
        else:
            yield {"ph": "X", "pid": pid, "tid": tid, "name": annotation.name,
                   "cat": annotation.kind, "ts": ts(annotation.start_ns),
                   "dur": round((annotation.end_ns - annotation.start_ns) / 1e3, 3)}
    named = set()
    for start_ns, device, timeline in tracker.kernels():   # modelled, from the launch's start
        pid = AICORE_PID + device
        if pid not in named:
            named.add(pid)
            yield {"ph": "M", "name": "process_name", "pid": pid,
                   "args": {"name": f"npu {device} AI cores (modelled, {timeline.profile.name})"}}
        yield from timeline.chrome_events(pid, ts(start_ns))
    for sample in samples:
        yield {"ph": "C", "name": "host", "pid": HOST_PID, "ts": ts(sample.time_ns),
               "args": {"rss": sample.host_rss}}
    for device in sorted(devices):
        yield {"ph": "M", "name": "process_name", "pid": _pid(device),
               "args": {"name": f"npu {device}"}}
    for (pid, raw), tid in sorted(tracks.items(), key=lambda item: item[1]):
        if pid == HOST_PID:
            name = f"thread {raw}"
        else:
            name = "default stream" if raw == 0 else f"stream 0x{raw:x}"
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
               "args": {"name": name}}


def write_chrome_trace(path, tracker: Tracker, samples: list[Sample] = ()) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write('{"traceEvents": [\n')
        for number, event in enumerate(iter_chrome_events(tracker, samples)):
            out.write(("," if number else "") + json.dumps(event, separators=(",", ":")) + "\n")
        out.write('], "displayTimeUnit": "ms", "otherData": ' + json.dumps(
            {"producer": "npumem", "dropped_events": tracker.dropped}) + "}\n")
