"""Leak reports: allocations still live at a point, grouped by the line that made them
(`Tracker.leaks()`; `leak_check.check_leaks` raises with one).

Only blocks handed to callers count: memory a pool keeps cached after a free is never a leak.
A leak's site is its innermost frame outside npumem (the user's line), so a tracker with stacks
gives exact file:line; without stacks, allocations are grouped by their op or range tag.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

from ..runtime.state import RUNTIME
from ..units import format_size
from .stacks import Frame

NO_SITE = "(unknown site: track with stacks=True to see file and line)"


@dataclass
class Site:
    """Allocations from one place."""

    where: str                     # "file:line in function", a tag, or NO_SITE
    frame: Frame | None
    count: int = 0
    bytes: int = 0
    stack: tuple[Frame, ...] = ()  # the first allocation's stack
    allocations: list = field(default_factory=list, repr=False)   # tracker MemoryEvents


def site_of(event) -> tuple[str, Frame | None]:
    """Where a tracker's MemoryEvent was allocated: its innermost frame, else its tag."""
    if event.frames:
        return str(event.frames[0]), event.frames[0]
    return (f"[{event.tag}]" if event.tag else NO_SITE), None


def group_by_site(events: list) -> list[Site]:
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

    def __init__(self, live: list):
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
