"""Where a recording's steps begin, and on what evidence.

Steps come first from what the run itself says, in this order (the first kind with two marks
or more is used, so that two kinds of mark in one run do not cut each step twice):

1. npumem's own marks (the tensor recorder writes one at each `npumem.memory.step()`,
   `torch.profiler`'s `step()` and `optimizer.step()`; of these, the first source named);
2. `torch.profiler`'s `ProfilerStep#N` scopes, then the `Optimizer.step#X.step` scope that
   torch.optim opens around every step, then a user's `record_function` scope named as a step,
   in a snapshot's "external_annotations";
3. PyTorch 2.14's `annotate` trace entries whose note names a step.

Without any, a step is inferred only where the recording repeats one (`step_inference`); the
answer says it was inferred, and why none was found when none was.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..trace.file_checks import TraceFormatError
from ..trace.snapshot.columns import ACTION_CODE, arrays
from ..trace.step_marks import NPUMEM_STEP, step_kind, step_positions

MARKED, INFERRED = "marked", "inferred"
NO_STEPS = "no repeating step found: leaks are not judged"

# npumem's marks, by the source the tensor recorder names, most deliberate first
_NPUMEM_SOURCES = ("npumem.memory.step", "torch.profiler", "optimizer.step")
_SCOPE_KINDS = ("profiler", "optimizer", "user")


@dataclass
class Steps:
    """A device's step boundaries: entry positions before which a step begins."""

    starts: list[int] = field(default_factory=list)
    source: str | None = None          # MARKED, INFERRED or None
    marker: str = ""                   # what marked them ("optimizer.step", "ProfilerStep", ...)
    reason: str = ""                   # why there are none, or how they were inferred
    period: int = 0                    # inferred: allocations per step

    @property
    def inferred(self) -> bool:
        return self.source == INFERRED

    def describe(self) -> str:
        if not self.starts:
            return self.reason or NO_STEPS
        if self.inferred:
            return (f"{len(self.starts)} steps inferred (not marked by the run): {self.reason}")
        return f"{len(self.starts)} steps marked by {self.marker}"

    def to_json(self) -> dict:
        return {"count": len(self.starts), "source": self.source, "marker": self.marker or None,
                "reason": self.reason or None}


def marked_steps(snapshot: dict, device: int) -> Steps | None:
    """The steps the run marked, or None where it marked none."""
    entries = (snapshot.get("device_traces") or [[]])[device]
    notes = [note for note in snapshot.get("external_annotations") or []
             if isinstance(note, dict) and note.get("stage") == "START"
             and note.get("device", device) == device]
    a = arrays(entries)
    mine = [note for note in notes if str(note.get("name", "")).partition("#")[0] == NPUMEM_STEP]
    if mine:
        sources = Counter(str(note.get("source") or "npumem.memory.step") for note in mine)
        source = next((s for s in _NPUMEM_SOURCES if sources[s] >= 2), sources.most_common(1)[0][0])
        chosen = [note for note in mine if str(note.get("source") or "npumem.memory.step") == source]
        found = _positions(chosen, a)
        if found is not None:
            return Steps(found, MARKED, source)
    by_kind: dict[str, list] = {}
    for note in notes:
        kind = step_kind(note.get("name"))
        if kind in _SCOPE_KINDS:
            by_kind.setdefault(kind, []).append(note)
    for kind in _SCOPE_KINDS:
        chosen = by_kind.get(kind) or []
        if kind == "user":            # the most frequent name of the user's step scopes
            names = Counter(str(note.get("name")).partition("#")[0] for note in chosen)
            chosen = [n for n in chosen if names and
                      str(n.get("name")).partition("#")[0] == names.most_common(1)[0][0]]
        if len(chosen) >= 2:
            found = _positions(chosen, a)
            if found is not None:
                return Steps(found, MARKED, str(chosen[0].get("name")).partition("#")[0])
    notes_at = np.flatnonzero(a.action == ACTION_CODE["annotate"])
    if len(notes_at):                 # 2.14's annotate entries: the position is the entry's own
        steps = [int(at) for at in notes_at.tolist()
                 if step_kind((a.extras[a.extra[at]] or {}).get("user_metadata")) is not None]
        if len(steps) >= 2:
            return Steps(steps, MARKED, "annotate entries")
    return None


def _positions(notes: list[dict], a) -> list[int] | None:
    try:
        name = str(notes[0].get("name")).partition("#")[0]       # every Optimizer.step#...
        return sorted(set(step_positions("", notes, name, a.time)))
    except TraceFormatError:          # an annotation without a time: not a mark to use
        return None
