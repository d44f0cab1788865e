"""npumem's memory profiler: tracking, leaks, sampling, fragmentation, exporters and reports.

    from npumem import profile

    with profile.track(stacks=True) as tracker:       # or @profile.track(), or NPUMEM_PROFILE=1
        with profile.range("forward"):
            step()
        profile.mark("step done")
    print(tracker.leaks())

    with profile.check_leaks():                         # raises LeakError naming file:line
        step()

Off by default and then free: allocators test one attribute. See docs/profiling.md.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time

from ..observe import OBSERVERS, tagged
from .analysis import analyze_snapshot, diff
from .fragmentation import analyze as analyze_fragmentation, format_fragmentation
from .leak_check import LeakError, check_leaks
from .leaks import LeakReport, settle
from .sampler import Sample, Sampler
from .snapshot import SnapshotError, build_snapshot, load_snapshot, save_snapshot
from .stacks import Frame
from .torch_memory import dump_snapshot_on_oom
from .tracker import Annotation, MemoryEvent, Tracker

__all__ = [
    "Annotation", "Frame", "LeakError", "LeakReport", "MemoryEvent", "Sample", "Sampler",
    "SnapshotError", "Tracker", "analyze_fragmentation", "analyze_snapshot", "build_snapshot",
    "check_leaks", "diff", "dump_snapshot_on_oom", "format_fragmentation", "load_snapshot", "mark", "range",
    "save_snapshot", "settle", "track",
]


def track(stacks: bool = False, max_entries: int = 1_000_000, max_frames: int = 16,
          torch_memory: bool | None = None) -> Tracker:
    """A new tracker: `with track() as t:`, `@track()`, or `t = track().start()`.

    It also records PyTorch's own memory when the program uses torch on a GPU or NPU
    (`t.torch_snapshot()`); `torch_memory=True` records the CPU too (through torch.profiler,
    which slows Python down), False never."""
    return Tracker(stacks=stacks, max_entries=max_entries, max_frames=max_frames,
                   torch_memory=torch_memory)


def _trackers():
    return [o for o in OBSERVERS.active if isinstance(o, Tracker)]


def mark(message: str) -> None:
    """An instant annotation (like mstx markA) in every running tracker's timeline."""
    now = time.perf_counter_ns()
    for tracker in _trackers():
        tracker.annotate("mark", message, now, now)


@contextlib.contextmanager
def range(message: str):                       # noqa: A001 - mstx's name, scoped to this module
    """A named span (like mstx rangeStart/End); allocations inside carry `message` as their tag."""
    start = time.perf_counter_ns()
    try:
        with tagged(message):
            yield
    finally:
        end = time.perf_counter_ns()
        for tracker in _trackers():
            tracker.annotate("range", message, start, end)


def _start_from_environment() -> None:
    """NPUMEM_PROFILE=1: profile the whole process and write a folder at exit
    (NPUMEM_PROFILE_OUT, default npumem-profile-<pid>; NPUMEM_PROFILE_STACKS=1 for stacks)."""
    if os.environ.get("NPUMEM_PROFILE", "").lower() not in ("1", "true", "yes", "on"):
        return
    from .session import ProfileSession, prepare_folder

    stacks = os.environ.get("NPUMEM_PROFILE_STACKS", "").lower() in ("1", "true", "yes", "on")
    interval = float(os.environ.get("NPUMEM_PROFILE_INTERVAL_MS", "10"))
    session = ProfileSession(stacks=stacks, interval_ms=interval).start()

    def finish() -> None:
        session.stop()
        out = os.environ.get("NPUMEM_PROFILE_OUT") or f"npumem-profile-{os.getpid()}"
        try:
            folder = prepare_folder(out, force=True)
        except Exception as exc:       # noqa: BLE001 - at exit, say it and go
            print(f"npumem profile: {exc}", file=sys.stderr)
            return
        for problem in session.write(folder, f"npumem profile of {' '.join(sys.argv)}"):
            print(f"npumem profile: could not write {problem}", file=sys.stderr)
        print(f"npumem profile: wrote {folder}/report.html", file=sys.stderr)

    atexit.register(finish)
