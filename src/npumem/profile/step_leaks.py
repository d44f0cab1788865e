"""Leaks in a recording are growth: a site whose bytes live at the step boundaries rise across
steps, as a trend.

For each site (the user's line, `leak_site`), its live bytes are taken at every step boundary
(`step_inference.find_steps`: marked by the run, or inferred where the recording repeats a step), never
at every event and never at the end: the frees at the end of a run or at an out-of-memory are
between boundaries, so they neither hide a leak nor make one. A site leaks when its series
rises as `trend` judges it (a robust slope, Mann-Kendall's test, the rise against the scatter,
still rising in the later half), rises at a quarter of the boundaries at least (memory made now
and then is no leak), and, where the steps differ in size (a varying batch or sequence),
follows the steps' order at least as closely as their size: growth that the variation
explains is not growth.
Where the steps were inferred, the site must also keep more allocations step after step: an
inferred step may be one token of a generation, whose cache grows by design by replacing one
buffer with a bigger one.

The growth per step is the robust slope. Each leak carries its evidence: the steps, the live
bytes at each boundary (thinned to MAX_SERIES points), the interval of the slope and its p.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..trace.snapshot.columns import ALLOC, arrays, index_type, sizes, take
from ..units import format_size
from .analysis import callers, live_blocks
from .leak_site import LeakSite, frame_text, leak_site
from .live_totals import live_before, live_changes
from .step_inference import find_steps
from .steps import Steps
from .trend import MIN_POINTS, Trend, trend

MIN_RISE_SHARE = 0.25    # boundaries at which a leaking site rises, at least
MIN_RISES = 3
SIMILAR = 0.10           # sizes closer than this say nothing of how bytes follow size
VARYING = 0.10           # steps vary in size when their spread is wider than this
EXPLAINS = 0.5           # size explains the bytes when it leaves less than this of step order's
MAX_BOUNDARIES = 512     # boundaries judged, at most (evenly thinned)
MAX_SERIES = 64          # boundary values kept as evidence


@dataclass
class StepLeak:
    """A site whose live bytes grew step over step."""

    where: str                          # the user's line (else the library's, else C++)
    per_step: float                     # bytes added per step (Theil-Sen)
    steps: int                          # the steps it was judged over
    live: int                           # its live bytes at the end
    count: int                          # its live allocations at the end
    categories: dict = field(default_factory=dict)   # category -> live bytes at the end
    stack: list = field(default_factory=list)        # callers of the user's line, outward
    inner: list = field(default_factory=list)        # frames inside it (libraries), inward
    site: LeakSite | None = None
    trend: Trend | None = None
    inferred: bool = False              # the steps were inferred, not marked
    device: int = 0
    series: list = field(default_factory=list)       # (step number, live bytes) evidence

    @property
    def allocated_in(self) -> str | None:
        return self.site.allocated_in if self.site else None

    def describe(self) -> str:
        kinds = ", ".join(f"{name} {format_size(n)}" for name, n in
                          sorted(self.categories.items(), key=lambda kv: -kv[1]))
        inside = f", allocated in {self.allocated_in}" if self.allocated_in else ""
        steps = "inferred steps" if self.inferred else "steps"
        held = (f"{format_size(self.live)} live in {self.count} allocation(s)"
                f"{': ' + kinds if kinds else ''}" if self.count else
                "all of it freed before the recording ended")
        return (f"+{format_size(self.per_step)} per step over {self.steps} {steps} at "
                f"{self.where}{inside} ({held})")

    def to_json(self) -> dict:
        frame = (self.site.user or self.site.library or self.site.native) if self.site else None
        t = self.trend
        return {
            "file": frame.get("filename") if frame else None,
            "line": frame.get("line") if frame else None,
            "function": frame.get("name") if frame else None,
            "where": self.where, "allocated_in": self.allocated_in,
            "growth_per_step_bytes": round(self.per_step, 1), "steps": self.steps,
            "steps_source": "inferred" if self.inferred else "marked", "device": self.device,
            "live_bytes": self.live, "allocations": self.count, "categories": self.categories,
            "evidence": {
                "live_bytes_at_boundaries": [[int(s), int(v)] for s, v in self.series],
                "growth_per_step_interval": [round(t.low, 1), round(t.high, 1)] if t else None,
                "p_value": float(f"{t.p_value:.3g}") if t else None,
                "confidence": t.confidence if t else None,
                "scatter_bytes": round(t.scatter, 1) if t else None},
            "stack": self.stack}


def step_starts(snapshot: dict, device: int) -> list[int]:
    """Entry positions of `device`'s trace where a step begins (`step_inference.find_steps`)."""
    return find_steps(snapshot, device).starts


def step_leaks(snapshot: dict, device: int = 0, starts: list[int] | Steps | None = None
               ) -> list[StepLeak]:
    """The sites of `device` that grew step over step, the fastest first. `starts`: its steps
    (Steps, or boundaries taken as marked), where the caller has them already."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces) or not len(traces[device]):
        return []
    steps = find_steps(snapshot, device) if starts is None else (
        starts if isinstance(starts, Steps) else Steps(list(starts), "marked"))
    entries = traces[device]
    a = arrays(entries)
    bounds = np.asarray(sorted(set(steps.starts)), dtype=np.int64)
    if len(bounds) < MIN_POINTS:
        return []
    numbers = np.arange(len(bounds))
    if len(bounds) > MAX_BOUNDARIES:
        keep = np.linspace(0, len(bounds) - 1, MAX_BOUNDARIES).astype(np.int64)
        bounds, numbers = bounds[keep], numbers[keep]
    moves, owner, change = live_changes(a)
    if not len(moves):
        return []
    allocs = np.flatnonzero(a.action == ALLOC)
    site_at = np.full(len(a), -1, dtype=index_type(len(a)))
    site_at[allocs], sites = _alloc_sites(a, allocs)
    series = _series(site_at[owner], moves, change, bounds, len(sites))
    blocks = _series(site_at[owner], moves, np.sign(change), bounds, len(sites))
    step_sizes = _step_sizes(a, allocs, bounds)
    found, live = [], None
    for index in _candidates(series):
        y = series[index]
        t = trend(numbers, y)
        if not t.rising or not _grows_beyond_size(numbers, y, step_sizes, t):
            continue
        # An inferred step may be one token of a generation, whose KV cache grows by design
        # (one buffer replaced by a bigger one each token): there, only a site that keeps
        # more and more allocations is a leak.
        if steps.inferred and trend(numbers, blocks[index]).slope <= 0:
            continue
        if live is None:                  # the blocks live at the end, once
            live = live_blocks(a, len(a), ("free_requested", "free_completed"))[1]
        found.append(_leak(entries, live, site_at, index, sites[index], t, numbers, y, steps,
                           device))
    return sorted(found, key=lambda leak: (-leak.per_step, leak.where))


def _series(site: np.ndarray, moves: np.ndarray, change: np.ndarray, bounds: np.ndarray,
            count: int) -> np.ndarray:
    """Each site's live bytes at each boundary: a change at entry i counts at every boundary
    after i."""
    column = np.searchsorted(bounds, moves, side="right")      # boundaries at or before i
    ok = site >= 0
    flat = site[ok].astype(np.int64) * (len(bounds) + 1) + column[ok]
    total = np.bincount(flat, weights=change[ok].astype(np.float64),
                        minlength=count * (len(bounds) + 1)).reshape(count, -1)
    return np.cumsum(total, axis=1)[:, :len(bounds)]


def _candidates(series: np.ndarray) -> list[int]:
    """Sites that end higher than they begin and rise at enough boundaries (a cheap filter
    before the statistics)."""
    if series.shape[1] < 2:
        return []
    rises = (np.diff(series, axis=1) > 0).sum(axis=1)
    need = max(MIN_RISES, int(np.ceil(MIN_RISE_SHARE * (series.shape[1] - 1))))
    return np.flatnonzero((series[:, -1] > series[:, 0]) & (rises >= need)).tolist()


def _step_sizes(a, allocs: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """How big the step before each boundary was: the bytes it allocated (from the boundary
    before to this one; the first, from the trace's start). What is live at a boundary is what
    the steps before it kept, so it is their size a batch or a sequence length shows in."""
    size = sizes(a)[allocs].astype(np.float64)
    total = np.r_[0.0, np.cumsum(size)]
    at = total[np.searchsorted(allocs, bounds)]
    return np.diff(np.r_[0.0, at])


def _grows_beyond_size(x: np.ndarray, y: np.ndarray, step_sizes: np.ndarray,
                       t: Trend) -> bool:
    """Where steps vary in size (a varying batch or sequence length), the live bytes must
    follow the steps' order at least as closely as their size: a tensor kept from the last
    batch follows the batch's size, up or down, and is no leak, even where the sizes happen to
    rise; a leak adds with every step whatever its size. Closeness is the robust scatter of
    what each line (bytes against step, `t`, and bytes against size) leaves unexplained, and
    size must leave clearly less (EXPLAINS): where the size itself grows step by step (a graph
    kept across steps makes the backward pass longer, a batch that grows), both lines explain
    the bytes alike, and the steps' order is taken."""
    size = step_sizes[:len(y)]
    middle = np.median(size)
    if middle <= 0 or (np.percentile(size, 90) - np.percentile(size, 10)) <= VARYING * middle:
        return True
    i, j = np.triu_indices(len(y), 1)
    apart = np.abs(size[j] - size[i]) > SIMILAR * np.maximum(size[i], size[j])
    if not apart.any():
        return True
    i, j = i[apart], j[apart]
    per_byte = float(np.median((y[j] - y[i]) / (size[j] - size[i])))
    left = y - per_byte * size
    by_size = 1.4826 * float(np.median(np.abs(left - np.median(left))))
    return not by_size < EXPLAINS * t.scatter


def _leak(entries, live, site_at, index: int, where: str, t: Trend, numbers, y, steps: Steps,
          device: int) -> StepLeak:
    mine = take(entries, live[site_at[live] == index])
    kinds = Counter()
    for e in mine:
        kinds[e.get("category") or "other"] += e.get("size", 0)
    # the site's stack from what of it is live at the end; where it was all freed before the
    # recording ended (a list of losses let go when the script finished), from its last
    # allocation: the leak is still named by file and line
    last = mine[-1] if mine else take(entries, np.flatnonzero(site_at == index)[-1:])[0]
    frames = last.get("frames") or []
    site = leak_site(frames, last.get("user_metadata"))
    chosen = site.user or site.library or site.native
    inner = frames[:frames.index(chosen)] if chosen in frames else []
    thin = np.unique(np.linspace(0, len(y) - 1, min(len(y), MAX_SERIES)).astype(np.int64))
    return StepLeak(where, t.slope, int(numbers[-1] - numbers[0]) + 1, int(sum(kinds.values())),
                    len(mine), dict(kinds), callers(frames, chosen),
                    [frame_text(f) for f in inner if str(f.get("filename", "")).endswith(".py")],
                    site, t, steps.inferred, device,
                    [(int(numbers[k]), int(y[k])) for k in thin])


def _alloc_sites(a, allocs: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(each alloc's site, as an index into the sites' names; the names): by its stack's
    `leak_site`, or for one without frames by its user_metadata tag. Each stack and tag is
    named once."""
    ids: dict[str, int] = {}
    stacks = a.stack_at(allocs)
    named = np.full(len(a.stacks), -1)       # each stack's site (-1: none, or no frames)
    for stack in np.flatnonzero(np.bincount(stacks, minlength=len(a.stacks))).tolist():
        if a.stacks[stack]:
            named[stack] = ids.setdefault(leak_site(a.stacks[stack]).key, len(ids))
    site = named[stacks]
    bare = np.flatnonzero(site < 0)
    if len(bare):
        extras = a.extra[allocs[bare]]
        tagged = np.full(len(a.extras), -1)  # each extra's site: by its user_metadata
        for extra in np.flatnonzero(np.bincount(extras, minlength=len(a.extras))).tolist():
            tagged[extra] = ids.setdefault(leak_site(
                None, a.extras[extra].get("user_metadata")).key, len(ids))
        site[bare] = tagged[extras]
    return site, list(ids)


def growth_per_step(snapshot: dict, device: int = 0,
                    starts: list[int] | None = None) -> list[int]:
    """Live bytes at each step boundary and at the end, less the first boundary's."""
    entries = (snapshot.get("device_traces") or [[]])[device]
    starts = step_starts(snapshot, device) if starts is None else starts
    a = arrays(entries)
    points = live_before(a, [*starts, len(a)]).tolist()      # (the end: past every entry)
    return [p - points[0] for p in points]
