"""Probable leaks from growth: a site whose live bytes keep rising while the program runs.

A leak into a global list does not wait for the end of the run to show: its site's live bytes
climb step after step. The tracker's events are replayed to each checkpoint: the ends of the
program's steps (its `npumem.memory.step()` calls, else its most frequent `profile.range`), or,
without either, evenly spaced moments of the run. A site grows when its live bytes at the
checkpoints rise as a trend (`trend`: a robust slope, Mann-Kendall's test, the rise against
the scatter), end higher than they began and rose more than once; memory a run allocates once
and keeps (weights, caches) rises once, so it is not reported.

    for probable in tracker.growth():      # any time, also while the program runs
        print(probable.describe())
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from ..units import format_size
from .leaks import site_of
from .trend import trend

CHECKPOINTS_WITHOUT_STEPS = 10


@dataclass
class Growth:
    """A site whose live bytes rose `rises` times over `intervals` intervals."""

    site: str
    first_bytes: int
    last_bytes: int
    rises: int
    intervals: int
    seconds: float
    unit: str                          # "step" (a named range) or "interval"

    @property
    def per_unit(self) -> float:
        return (self.last_bytes - self.first_bytes) / self.intervals

    @property
    def per_second(self) -> float:
        return (self.last_bytes - self.first_bytes) / self.seconds if self.seconds else 0.0

    def describe(self) -> str:
        return (f"{self.site}: live bytes grew from {format_size(self.first_bytes)} to "
                f"{format_size(self.last_bytes)}, {format_size(round(self.per_unit))} per "
                f"{self.unit} ({format_size(round(self.per_second))}/s), rising in {self.rises} "
                f"of {self.intervals} {self.unit}s")


def checkpoints(events: list, annotations: list) -> tuple[list[int], str]:
    """(times in ns, unit): the step marks if there are at least three, else the ends of the
    most frequent range if it ran at least three times, else evenly spaced moments over the
    events."""
    marks = sorted(note.start_ns for note in annotations if note.kind == "step")
    if len(marks) >= 3:
        return marks, "step (npumem.memory.step)"
    ends = collections.defaultdict(list)
    for note in annotations:
        if note.kind == "range":
            ends[note.name].append(note.end_ns)
    if ends:
        name, times = max(ends.items(), key=lambda item: len(item[1]))
        if len(times) >= 3:
            return sorted(times), f"step ({name})"
    if len(events) < 2:
        return [], "interval"
    first, last = events[0].time_ns, events[-1].time_ns
    count = CHECKPOINTS_WITHOUT_STEPS
    return [first + (last - first) * (k + 1) // count for k in range(count)], "interval"


def live_by_site(events: list, times: list[int]) -> list[dict[str, int]]:
    """Per checkpoint time, the live requested bytes of each site (allocations seen so far)."""
    live: dict[tuple[int, int], tuple[str, int]] = {}      # (device, address) -> (site, bytes)
    totals: dict[str, int] = collections.Counter()
    series, next_point = [], 0
    for event in events:
        while next_point < len(times) and event.time_ns > times[next_point]:
            series.append(dict(totals))
            next_point += 1
        key = (event.device, event.address)
        if event.action == "alloc":
            where = site_of(event)[0]
            live[key] = (where, event.requested)
            totals[where] += event.requested
        elif event.action in ("free", "free_completed") and key in live:
            where, nbytes = live.pop(key)
            totals[where] -= nbytes
    series += [dict(totals)] * (len(times) - next_point)
    return series


def find_growth(events: list, annotations: list) -> list[Growth]:
    """The sites whose live bytes kept rising, fastest first."""
    events = [e for e in events if e.action in ("alloc", "free", "free_completed")]
    times, unit = checkpoints(events, annotations)
    if len(times) < 3:
        return []
    series = live_by_site(events, times)
    seconds = (times[-1] - times[0]) / 1e9
    found = []
    for site in set().union(*series):
        values = [point.get(site, 0) for point in series]
        steps = list(zip(values, values[1:]))
        rises = sum(b > a for a, b in steps)
        # over steps, a trend, as a recording's leaks are judged (trend.py): robust to a free
        # now and then, and to memory made once; over moments of time (no steps to compare),
        # a rise that never falls, reported as probable only
        rising = (trend(range(len(values)), values).rising if unit.startswith("step") else
                  all(b >= a for a, b in steps))
        if rises >= 2 and values[-1] > values[0] and rising:
            found.append(Growth(site, values[0], values[-1], rises, len(steps), seconds,
                                unit.split(" ")[0]))
    return sorted(found, key=lambda g: -g.per_unit)

