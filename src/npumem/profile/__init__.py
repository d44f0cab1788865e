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
from ..trace.snapshot import SnapshotError, load_snapshot
from .snapshot import build_snapshot, save_snapshot
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


_ENVIRONMENT_SESSION: list = []          # the NPUMEM_PROFILE=1 session of this process, if any
_YES = ("1", "true", "yes", "on")


def _start_from_environment() -> None:
    """NPUMEM_PROFILE=1: profile the whole process and write a folder at exit
    (NPUMEM_PROFILE_OUT, default npumem-profile-<pid>; NPUMEM_PROFILE_STACKS=1 for stacks).

    Called at interpreter start by npumem-profile.pth (so any Python program is profiled,
    also one that never imports npumem) and again when npumem is imported: it starts once.
    A child process whose parent is profiled into one NPUMEM_PROFILE_OUT is not profiled:
    both would write that folder. Never raises: a profile must not break the program."""
    if os.environ.get("NPUMEM_PROFILE", "").strip().lower() not in _YES or _ENVIRONMENT_SESSION:
        return
    owner = os.environ.get("_NPUMEM_PROFILED_BY")
    if owner and owner != str(os.getpid()) and os.environ.get("NPUMEM_PROFILE_OUT"):
        return
    try:
        from .session import ProfileSession

        stacks = os.environ.get("NPUMEM_PROFILE_STACKS", "").strip().lower() in _YES
        interval = float(os.environ.get("NPUMEM_PROFILE_INTERVAL_MS", "10"))
        if not interval > 0:
            raise ValueError(f"NPUMEM_PROFILE_INTERVAL_MS={interval:g}: must be positive")
        out = os.path.abspath(os.environ.get("NPUMEM_PROFILE_OUT")
                              or f"npumem-profile-{os.getpid()}")
        session = ProfileSession(stacks=stacks, interval_ms=interval).start()
    except Exception as exc:       # noqa: BLE001 - say it in one line; the program runs on
        print(f"npumem profile: not profiling: {exc}", file=sys.stderr)
        return
    os.environ["_NPUMEM_PROFILED_BY"] = str(os.getpid())
    _ENVIRONMENT_SESSION[:] = [session, os.getpid(), out]
    atexit.register(_finish_environment_session)


def stop_environment_session() -> None:
    """Stop this process's NPUMEM_PROFILE session without writing it (`npumem profile` makes
    the profile itself)."""
    if _ENVIRONMENT_SESSION:
        session = _ENVIRONMENT_SESSION[0]
        _ENVIRONMENT_SESSION.clear()
        atexit.unregister(_finish_environment_session)
        session.stop(quick=True)


def _finish_environment_session() -> None:
    """At exit: the folder, as `npumem profile` writes it; after a Ctrl-C that ended the
    program, only the snapshots, quickly. Not in a forked child (its parent writes)."""
    if not _ENVIRONMENT_SESSION or _ENVIRONMENT_SESSION[1] != os.getpid():
        return
    from .folder import claim_folder

    session, _, out = _ENVIRONMENT_SESSION
    _ENVIRONMENT_SESSION.clear()
    interrupted = isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)
    title = f"npumem profile of {' '.join(sys.argv)}"
    try:
        folder, lock = claim_folder(out, force=True)
    except Exception as exc:       # noqa: BLE001 - at exit, say it and go
        session.stop(quick=True)
        print(f"npumem profile: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return
    try:
        if interrupted:
            problems = session.write_interrupted(folder, title)
            import gc

            gc.freeze()      # the process ends now: no last collections over the recording
        else:
            session.stop()
            problems = session.write(folder, title)
    except KeyboardInterrupt:
        problems = ["interrupted while writing"]
    finally:
        lock.release()
    for problem in problems:
        print(f"npumem profile: could not write {problem}", file=sys.stderr)
    if session.incomplete:
        print(f"npumem profile: incomplete: {', '.join(session.incomplete)} not written",
              file=sys.stderr)
    kept = ", ".join(session.written) or "nothing"
    if interrupted:
        print(f"npumem profile: interrupted: kept {kept} in {folder}; the reports were skipped "
              "(npumem report makes them from the snapshot)", file=sys.stderr)
    else:
        page = folder / "report.html" if "report.html" in session.written else folder
        print(f"npumem profile: wrote {page} ({kept})", file=sys.stderr)
