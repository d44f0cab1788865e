"""Where a recorded program's steps begin, read from its memory snapshot, so that a replay with
predictive pre-allocation marks them as `npumem.memory.step()` did in the program.

A snapshot's "external_annotations" hold {"name", "stage": "START" or "END", "device",
"time_us"}. PyTorch (2.5 and later) records `torch.profiler.record_function` scopes there
while memory history is on, and the profiler's `ProfilerStep#N` around each `prof.step()`;
npumem records each `npumem.memory.step()` as a START of "npumem.memory.step", with the index
of the trace entry it came before (`npumem_entry`: exact where time stamps in whole µs tie).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

from .events import TraceFormatError

NPUMEM_STEP = "npumem.memory.step"
PROFILER_STEP = "ProfilerStep"          # torch.profiler's step scopes: ProfilerStep#0, #1, ...


def named(annotation: dict) -> str:
    """An annotation's name without a `#N` count (ProfilerStep#12 -> ProfilerStep)."""
    return str(annotation.get("name", "")).partition("#")[0]


def starts_named(recording, name: str) -> list[dict]:
    return [annotation for annotation in recording.annotations
            if annotation.get("stage") == "START" and named(annotation) == name]


def step_entries(recording, name: str | None) -> list[int]:
    """Indices into the recording's trace entries before which a step begins: where START
    annotations named `name` (or `name#N`) begin, or, with no name, where
    `npumem.memory.step()` was called (none if it never was). TraceFormatError says which
    annotations the snapshot has when `name` matches none."""
    starts = starts_named(recording, name or NPUMEM_STEP)
    if name and not starts:
        raise TraceFormatError(recording.path, "external_annotations",
                               f"no START annotation named {name!r}; {_what_there_is(recording)}")
    times = None
    at = []
    for annotation in starts:
        entry = annotation.get("npumem_entry")
        if isinstance(entry, int) and not isinstance(entry, bool) and entry >= 0:
            at.append(entry)
            continue
        when = annotation.get("time_us")
        if not isinstance(when, (int, float)) or isinstance(when, bool):
            raise TraceFormatError(recording.path, "external_annotations",
                                   f"a START of {annotation.get('name')!r} has no time_us "
                                   f"number (got {when!r})")
        if times is None:
            times = [float(entry.get("time_us", 0) or 0) for entry in recording.entries]
        at.append(bisect_left(times, when))        # before the first entry at or after it
    return sorted(at)


def _what_there_is(recording) -> str:
    names = Counter(named(annotation) for annotation in recording.annotations
                    if annotation.get("stage") == "START")
    if not names:
        return ("the snapshot has no annotations (PyTorch records them from 2.5 on, "
                "for torch.profiler.record_function scopes, while memory history is on)")
    common = ", ".join(f"{name!r} ({count})" for name, count in names.most_common(5))
    return f"its START annotations: {common}" + (", ..." if len(names) > 5 else "")


def hint(recording) -> str | None:
    """A note for a replay without marks of a snapshot whose profiler steps could mark them."""
    count = len(starts_named(recording, PROFILER_STEP))
    if count < 2:
        return None
    return (f"the snapshot has {count} torch.profiler steps ({PROFILER_STEP}#N annotations); "
            f"--steps {PROFILER_STEP} marks a step at each, as npumem.memory.step() would")
