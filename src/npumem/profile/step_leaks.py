"""Leaks in a PyTorch recording are growth: memory allocated in one step and still live steps
later, more of it at each step. A training loop's weights and optimizer state are made once
(in the first step or before it), so they rise once and are never called leaks; a list that
keeps each step's loss graph alive rises at every step.

Steps are the recording's step marks (`optimizer.step()`, `torch.profiler`'s `step()`,
`npumem.memory.step()`, as the tensor recorder writes them, or PyTorch's ProfilerStep
annotations), else the step the program repeats, as npumem's step learner finds it. For each site, the user's own line (the innermost frame outside installed
libraries, the standard library, torch and npumem), the live bytes are taken at every step
boundary and at the end. A site leaks when its live bytes never fall from the first boundary
on and rise at least twice, and in at least half the steps (memory made once, in the first step
or later, rises once); its growth per step is the rise over the steps it spans.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..trace.snapshot.columns import rows, take
from ..trace.file_checks import TraceFormatError
from ..trace.step_marks import PROFILER_STEP, starts_named, step_positions
from ..units import format_size
from .analysis import callers, site_name, user_frame

MIN_RISES = 2


@dataclass
class StepLeak:
    """A site whose live bytes grew step over step."""

    where: str                          # the user's line
    per_step: float                     # bytes added per step, on average
    steps: int                          # the steps it grew over
    live: int                           # its live bytes at the end
    count: int                          # its live allocations at the end
    categories: dict = field(default_factory=dict)   # category -> live bytes at the end
    stack: list = field(default_factory=list)        # callers of the user's line, outward
    inner: list = field(default_factory=list)        # frames inside it (libraries), inward

    def describe(self) -> str:
        kinds = ", ".join(f"{name} {format_size(n)}" for name, n in
                          sorted(self.categories.items(), key=lambda kv: -kv[1]))
        return (f"+{format_size(self.per_step)} per step over {self.steps} steps at {self.where}"
                f" ({format_size(self.live)} live in {self.count} allocation(s): {kinds})")


LEARN_ALLOCATIONS = 200_000            # allocations the step learner looks through, at most


def step_starts(snapshot: dict, device: int) -> list[int]:
    """Entry positions of `device`'s trace where a step begins (sorted, distinct): the marked
    steps, else the step the program repeats (`learned_steps`)."""
    return marked_steps(snapshot, device) or learned_steps(
        (snapshot.get("device_traces") or [[]])[device])


def learned_steps(entries: list[dict]) -> list[int]:
    """Where the step a program repeats begins, found by npumem's step learner from the sizes
    of its requests (alloc/step_learner.py): every period from the first whole copy on. Empty
    when no period is confirmed."""
    from ..alloc.step_learner import StepLearner

    learner = StepLearner()
    alloc_positions: list[int] = []
    found = None
    for position, (action, addr, size, *_) in enumerate(rows(entries)):
        if action == "alloc":
            alloc_positions.append(position)
            if found is not None:
                continue                     # the period is known: only count allocations
            learner.on_alloc(addr, size, size)
            if learner.confirmed:
                found = (learner.confirmed, learner.anchor)
            elif len(alloc_positions) >= LEARN_ALLOCATIONS:
                return []
        elif action == "free_completed" and found is None:
            learner.on_free(addr)
    if found is None:
        return []
    period, anchor = found
    return alloc_positions[anchor::period]


def marked_steps(snapshot: dict, device: int) -> list[int]:
    """Entry positions where a marked step begins: optimizer.step(), torch.profiler's steps,
    npumem.memory.step() (as the tensor recorder writes them), ProfilerStep annotations."""
    notes = [note for note in snapshot.get("external_annotations") or []
             if isinstance(note, dict) and note.get("device", device) == device]
    if not notes:
        return []
    entries = (snapshot.get("device_traces") or [[]])[device]
    times = [time_us for _, _, _, _, time_us, *_ in rows(entries)]
    try:
        positions = step_positions("", notes, None, times)       # npumem's own marks
        if starts_named(notes, PROFILER_STEP):
            positions += step_positions("", notes, PROFILER_STEP, times)
    except TraceFormatError:                 # an annotation without a time: no steps to use
        return []
    return sorted(set(positions))


def step_leaks(snapshot: dict, device: int = 0, starts: list[int] | None = None) -> list[StepLeak]:
    """The sites of `device` that grew step over step, the fastest first (none without three
    step boundaries). `starts`: step_starts, where the caller has them already."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return []
    entries = traces[device]
    starts = step_starts(snapshot, device) if starts is None else starts
    if len(starts) < MIN_RISES + 1:
        return []
    sites: dict[int, str] = {}                  # id(frames) -> site: stacks are shared
    live: dict[int, tuple[dict, str]] = {}
    by_site: dict[str, int] = defaultdict(int)
    samples: list[dict] = []                     # by_site at each boundary, then at the end
    next_start = 0
    for index, (action, addr, size, _, _, frames, extra, _) in enumerate(rows(entries)):
        while next_start < len(starts) and starts[next_start] <= index:
            samples.append(dict(by_site))
            next_start += 1
        if action == "alloc":
            where = sites.get(id(frames)) if frames else None
            if where is None:
                where = site_name({"frames": frames, "user_metadata": extra.get("user_metadata")})
                if frames:
                    sites[id(frames)] = where
            live[addr] = (index, size, where)
            by_site[where] += size
        elif action in ("free_requested", "free_completed"):
            _, size, where = live.pop(addr, (None, 0, None))
            if where is not None:
                by_site[where] -= size
    samples += [dict(by_site)] * (len(starts) - next_start)
    samples.append(dict(by_site))
    leaks = []
    for where in by_site:
        series = [sample.get(where, 0) for sample in samples]
        rises = sum(1 for a, b in zip(series, series[1:]) if b > a)
        falls = any(b < a for a, b in zip(series, series[1:]))
        # growth step over step: in at least half the steps (memory made now and then, over
        # thousands of steps, rises a few times and is no leak)
        if falls or rises < max(MIN_RISES, (len(series) - 1) // 2):
            continue
        # per step over the steps it grew in: from its first value to its last rise
        spans = max(i for i in range(1, len(series)) if series[i] > series[i - 1])
        mine = take(entries, [index for index, _, site in live.values() if site == where])
        kinds = Counter()
        for e in mine:
            kinds[e.get("category") or "other"] += e.get("size", 0)
        frames = mine[-1].get("frames") or [] if mine else []
        chosen = user_frame(frames)
        inner = frames[:frames.index(chosen)] if chosen in frames else []
        leaks.append(StepLeak(where, (series[-1] - series[0]) / max(spans, 1), spans,
                              series[-1], len(mine), dict(kinds), callers(frames, chosen),
                              [f"{f.get('filename')}:{f.get('line')} in {f.get('name')}"
                               for f in inner]))
    return sorted(leaks, key=lambda leak: (-leak.per_step, leak.where))


def growth_per_step(snapshot: dict, device: int = 0,
                    starts: list[int] | None = None) -> list[int]:
    """Live bytes at each step boundary and at the end, less the first boundary's."""
    entries = (snapshot.get("device_traces") or [[]])[device]
    starts = step_starts(snapshot, device) if starts is None else starts
    live, total, points, next_start = {}, 0, [], 0
    for index, (action, addr, size, *_) in enumerate(rows(entries)):
        while next_start < len(starts) and starts[next_start] <= index:
            points.append(total)
            next_start += 1
        if action == "alloc":
            live[addr] = size
            total += size
        elif action in ("free_requested", "free_completed"):
            total -= live.pop(addr, 0)
    points += [total] * (len(starts) - next_start) + [total]
    return [p - points[0] for p in points] if points else []
