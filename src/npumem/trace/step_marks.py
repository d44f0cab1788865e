"""Where a recorded program's steps begin, read from its trace, so that a replay with predictive
pre-allocation marks them as `npumem.memory.step()` did in the program.

- A memory snapshot's "external_annotations" hold {"name", "stage": "START" or "END",
  "device", "time_us"}. PyTorch (2.5 and later) records `torch.profiler.record_function`
  scopes there while memory history is on, and the profiler's `ProfilerStep#N` around each
  `prof.step()`; npumem records each `npumem.memory.step()` as a START of
  "npumem.memory.step", with the index of the trace entry it came before (`npumem_entry`:
  exact where time stamps in whole µs tie).
- A profiler Chrome trace holds the same scopes as "user_annotation" spans (`chrome`).
- torch.optim opens `Optimizer.step#SGD.step` around every optimizer step, and a user's own
  `record_function("train_step")` names a step too; PyTorch 2.14 writes `annotate` trace
  entries whose user_metadata may name one. `step_kind` says which names are steps; the leak
  analysis reads them in profile/steps.py.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from math import isfinite

from .file_checks import TraceFormatError

NPUMEM_STEP = "npumem.memory.step"
PROFILER_STEP = "ProfilerStep"          # torch.profiler's step scopes: ProfilerStep#0, #1, ...
# torch.optim wraps every step() in record_function("Optimizer.step#SGD.step"), so a snapshot
# recorded with memory history holds one START of it per optimizer step
OPTIMIZER_STEP = "Optimizer.step"
# a user's own record_function scope is a step when its name says so: "train_step",
# "step", "Training Step", "iteration"; not a compiler's scopes ("... (dynamo_timed)")
_USER_STEP = re.compile(r"(?i)(?:^|[^a-z])(?:step|iter|iteration)(?:[^a-z]|$)")
_NOT_A_STEP = ("(dynamo_timed)", "Optimizer.zero_grad", "lr_scheduler")


def step_kind(name: str) -> str | None:
    """What kind of step mark a scope or note named `name` is: "npumem" (npumem.memory.step),
    "profiler" (ProfilerStep#N), "optimizer" (Optimizer.step#X.step), "user" (a scope whose
    name says step or iteration), or None."""
    name = str(name or "")
    base = name.partition("#")[0]
    if base == NPUMEM_STEP:
        return "npumem"
    if base == PROFILER_STEP:
        return "profiler"
    if base in (OPTIMIZER_STEP, "optimizer.step"):
        return "optimizer"
    if any(mark in name for mark in _NOT_A_STEP):
        return None
    return "user" if _USER_STEP.search(name.replace("_", " ")) else None


def named(annotation: dict) -> str:
    """An annotation's name without a `#...` suffix (ProfilerStep#12 -> ProfilerStep)."""
    return str(annotation.get("name", "")).partition("#")[0]


def starts_named(annotations: list[dict], name: str) -> list[dict]:
    return [annotation for annotation in annotations
            if annotation.get("stage") == "START" and named(annotation) == name]


def step_positions(path: str, annotations: list[dict], name: str | None,
                   times: list[float]) -> list[int]:
    """Positions in a trace's entries (`times`: their time stamps, in order) before which a
    step begins: where START annotations named `name` (or `name#...`) begin, or, with no name,
    where `npumem.memory.step()` was called (none if it never was). TraceFormatError says
    which annotations the trace has when `name` matches none."""
    starts = starts_named(annotations, name or NPUMEM_STEP)
    if name and not starts:
        raise TraceFormatError(path, "annotations", f"no START annotation named {name!r}; "
                                                    f"{_what_there_is(annotations)}")
    at = []
    for annotation in starts:
        entry = annotation.get("npumem_entry")
        if isinstance(entry, int) and not isinstance(entry, bool) and entry >= 0:
            at.append(entry)
            continue
        # before the first entry at or after it
        at.append(bisect_left(times, _time_us(path, annotation)))
    return sorted(at)


def _time_us(path: str, annotation: dict) -> float:
    when = annotation.get("time_us")
    try:
        if isinstance(when, (int, float)) and not isinstance(when, bool) and isfinite(when):
            return float(when)
    except OverflowError:                   # an int past float's range
        pass
    raise TraceFormatError(path, "annotations", f"a START of {annotation.get('name')!r:.60} has "
                                                f"no time_us number (got {when!r:.40})")


def marks_before(positions: list[int], numbered) -> tuple[list, list[int]]:
    """The events of `numbered` ((entry position, event) pairs; -1: before every entry) and
    where in them a step is marked: before the first event at or after each position, once."""
    events, marks, next_position = [], [], 0
    for position, event in numbered:
        while next_position < len(positions) and positions[next_position] <= position:
            next_position += 1
            if not marks or marks[-1] != len(events):
                marks.append(len(events))
        events.append(event)
    if next_position < len(positions) and (not marks or marks[-1] != len(events)):
        marks.append(len(events))                 # after the last event
    return events, marks


def _what_there_is(annotations: list[dict]) -> str:
    names = Counter(named(annotation) for annotation in annotations
                    if annotation.get("stage") == "START")
    if not names:
        return ("the trace has no annotations (PyTorch records them for "
                "torch.profiler.record_function scopes: in a memory snapshot from 2.5 on, "
                "while memory history is on)")
    common = ", ".join(f"{name!r} ({count})" for name, count in names.most_common(5))
    return f"its START annotations: {common}" + (", ..." if len(names) > 5 else "")


def hint(annotations: list[dict]) -> str | None:
    """A note for a replay without marks of a trace whose profiler steps could mark them."""
    count = len(starts_named(annotations, PROFILER_STEP))
    if count < 2:
        return None
    return (f"the trace has {count} torch.profiler steps ({PROFILER_STEP}#N annotations); "
            f"--steps {PROFILER_STEP} marks a step at each, as npumem.memory.step() would")
