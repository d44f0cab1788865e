"""Leak reports: allocations still live at a point, grouped by the line that made them.

    with npumem.profile.check_leaks():      # raises LeakError with the report
        step()

Only blocks handed to callers count: memory a pool keeps cached after a free is never a leak.
A leak's site is its innermost frame outside npumem (the user's line), so a tracker with stacks
gives exact file:line; without stacks, allocations are grouped by their op or range tag.
"""

from __future__ import annotations

import functools
import gc
from dataclasses import dataclass, field

from ..runtime.state import RUNTIME
from ..units import format_size
from .stacks import Frame
from .tracker import MemoryEvent, Tracker

NO_SITE = "(unknown site: track with stacks=True to see file and line)"


@dataclass
class Site:
    """Allocations from one place."""

    where: str                     # "file:line in function", a tag, or NO_SITE
    frame: Frame | None
    count: int = 0
    bytes: int = 0
    stack: tuple[Frame, ...] = ()  # the first allocation's stack
    allocations: list[MemoryEvent] = field(default_factory=list, repr=False)


def site_of(event: MemoryEvent) -> tuple[str, Frame | None]:
    if event.frames:
        return str(event.frames[0]), event.frames[0]
    return (f"[{event.tag}]" if event.tag else NO_SITE), None


def group_by_site(events: list[MemoryEvent]) -> list[Site]:
    """Sites, largest bytes first."""
    sites: dict[str, Site] = {}
    for event in events:
        where, frame = site_of(event)
        site = sites.get(where)
        if site is None:
            site = sites[where] = Site(where, frame, stack=event.frames)
        site.count += 1
        site.bytes += event.requested
        site.allocations.append(event)
    return sorted(sites.values(), key=lambda s: (-s.bytes, s.where))


def settle(timeout: float = 10.0) -> None:
    """Let queued device work finish (it may hold the last reference to a tensor) and collect
    garbage, so what is still live afterwards is really held. Stream errors stay for the caller."""
    if RUNTIME.initialized:
        for context in list(RUNTIME.contexts):
            for stream in [context.default_stream, *context.streams]:
                if not stream.destroyed:
                    stream.drain(timeout)
    gc.collect()


class LeakReport:
    """Live allocations at one point (requested bytes), grouped by site."""

    def __init__(self, live: list[MemoryEvent]):
        self.allocations = live
        self.sites = group_by_site(live)
        self.count = len(live)
        self.bytes = sum(event.requested for event in live)

    def __bool__(self) -> bool:
        return bool(self.allocations)

    def format(self, limit: int = 20, stack_depth: int = 6) -> str:
        if not self.allocations:
            return "No leaks: every allocation made while tracking was freed."
        lines = [f"{self.count} allocation(s) still live, {format_size(self.bytes)}, "
                 f"from {len(self.sites)} site(s):"]
        for site in self.sites[:limit]:
            first = site.allocations[0]
            lines.append(f"  {format_size(site.bytes)} in {site.count} allocation(s) at {site.where}"
                         f"  (device {first.device}, {first.source}, e.g. 0x{first.address:x})")
            for frame in site.stack[1:stack_depth]:
                lines.append(f"      called from {frame}")
        if len(self.sites) > limit:
            lines.append(f"  ... and {len(self.sites) - limit} more site(s)")
        return "\n".join(lines)

    __str__ = format


class LeakError(AssertionError):
    """Allocations made inside a `check_leaks()` block were still live at its end."""

    def __init__(self, report: LeakReport):
        self.report = report
        super().__init__(report.format())


class check_leaks:
    """Raise LeakError if allocations made inside the block are still live at its end.

    Garbage is collected first, so tensors only held by reference cycles are not reported.
    `stacks=True` (default) gives each leak's file and line. As a decorator it checks each call.
    """

    def __init__(self, stacks: bool = True, max_entries: int = 100_000):
        self._stacks, self._max_entries = stacks, max_entries
        self.tracker: Tracker | None = None
        self.report: LeakReport | None = None

    def __enter__(self) -> "check_leaks":
        self.tracker = Tracker(stacks=self._stacks, max_entries=self._max_entries).start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        settle()
        self.tracker.stop()
        self.report = self.tracker.leaks()
        if self.report and exc_type is None:     # never hide the block's own exception
            raise LeakError(self.report)

    def __call__(self, function):
        @functools.wraps(function)
        def checked(*args, **kwargs):
            with check_leaks(self._stacks, self._max_entries):
                return function(*args, **kwargs)
        return checked
