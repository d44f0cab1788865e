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

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..trace.snapshot.columns import (ALLOC, FREE_COMPLETED, arrays, block_order, index_type, levels,
                                      sizes, take)
from ..trace.file_checks import TraceFormatError
from ..trace.step_marks import PROFILER_STEP, starts_named, step_positions
from ..units import format_size
from .analysis import callers, live_blocks, site_name, user_frame

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


_CHUNK = 1 << 14                   # entries the learner is handed as Python numbers at a time


def learned_steps(entries: list[dict]) -> list[int]:
    """Where the step a program repeats begins, found by npumem's step learner from the sizes
    of its requests (alloc/step_learner.py): every period from the first whole copy on. Empty
    when no period is confirmed. The learner reads the entries up to its answer only."""
    from ..alloc.step_learner import StepLearner

    a = arrays(entries)
    allocs = np.flatnonzero(a.action == ALLOC)
    # the learner sees at most LEARN_ALLOCATIONS allocations
    end = int(allocs[LEARN_ALLOCATIONS - 1]) + 1 if len(allocs) >= LEARN_ALLOCATIONS else len(a)
    learner = StepLearner()
    found = None
    for start in range(0, end, _CHUNK):
        stop = min(start + _CHUNK, end)
        for action, addr, size in zip(a.action[start:stop].tolist(), a.addr[start:stop].tolist(),
                                      a.size[start:stop].tolist()):
            if action == ALLOC:
                learner.on_alloc(addr, size, size)
                if learner.confirmed:
                    found = (learner.confirmed, learner.anchor)
                    break
            elif action == FREE_COMPLETED:
                learner.on_free(addr)
        if found is not None:
            break
    if found is None:
        return []
    period, anchor = found
    return allocs[anchor::period].tolist()


def marked_steps(snapshot: dict, device: int) -> list[int]:
    """Entry positions where a marked step begins: optimizer.step(), torch.profiler's steps,
    npumem.memory.step() (as the tensor recorder writes them), ProfilerStep annotations."""
    notes = [note for note in snapshot.get("external_annotations") or []
             if isinstance(note, dict) and note.get("device", device) == device]
    if not notes:
        return []
    times = arrays((snapshot.get("device_traces") or [[]])[device]).time
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
    a = arrays(entries)
    moves, owner, change = _live_changes(a)
    if not len(moves):
        return []
    allocs = np.flatnonzero(a.action == ALLOC)
    site_at = np.full(len(a), -1, dtype=index_type(len(a)))      # each alloc's site
    site_at[allocs], names = _alloc_sites(a, allocs)
    site = site_at[owner]
    # A site's series: its live bytes at each boundary, then at the end. A change at entry i
    # counts from sample b on, b the number of boundaries at or before i; summed per (site, b),
    # the changes are the steps of the series.
    boundary = levels(0, np.ones(len(starts), dtype=np.int64), np.asarray(starts),
                      len(a))[moves]
    # moves are in entry order, so b ascends within each site (a radix sort for few sites)
    order = np.argsort(site.astype(np.uint16) if len(names) <= 1 << 16 else site, kind="stable")
    site, boundary, change = site[order], boundary[order], change[order]
    runs = np.flatnonzero(np.r_[True, (site[1:] != site[:-1]) | (boundary[1:] != boundary[:-1])])
    site, boundary, step = site[runs], boundary[runs], np.add.reduceat(change, runs)
    later = boundary > 0
    rise, fall = later & (step > 0), later & (step < 0)
    rises = np.bincount(site[rise], minlength=len(names))
    falls = np.bincount(site[fall], minlength=len(names))
    spans = np.zeros(len(names), dtype=np.int64)     # where each site last rose
    np.maximum.at(spans, site[rise], boundary[rise])
    first = np.zeros(len(names), dtype=step.dtype)   # its first value
    first[site[~later]] = step[~later]
    last = np.zeros(len(names), dtype=step.dtype)    # and its last
    np.add.at(last, site, step)
    # growth step over step: in at least half the steps (memory made now and then, over
    # thousands of steps, rises a few times and is no leak)
    growing = np.flatnonzero((falls == 0) & (rises >= max(MIN_RISES, len(starts) // 2)))
    if not len(growing):
        return []
    _, live = live_blocks(a, len(a), ("free_requested", "free_completed"))
    leaks = []
    for index in growing.tolist():
        # per step over the steps it grew in: from its first value to its last rise
        spanned, grown = int(spans[index]), int(last[index]) - int(first[index])
        mine = take(entries, live[site_at[live] == index])
        kinds = Counter()
        for e in mine:
            kinds[e.get("category") or "other"] += e.get("size", 0)
        frames = mine[-1].get("frames") or [] if mine else []
        chosen = user_frame(frames)
        inner = frames[:frames.index(chosen)] if chosen in frames else []
        leaks.append(StepLeak(names[index], grown / max(spanned, 1), spanned, int(last[index]),
                              len(mine), dict(kinds), callers(frames, chosen),
                              [f"{f.get('filename')}:{f.get('line')} in {f.get('name')}"
                               for f in inner]))
    return sorted(leaks, key=lambda leak: (-leak.per_step, leak.where))


def growth_per_step(snapshot: dict, device: int = 0,
                    starts: list[int] | None = None) -> list[int]:
    """Live bytes at each step boundary and at the end, less the first boundary's."""
    entries = (snapshot.get("device_traces") or [[]])[device]
    starts = step_starts(snapshot, device) if starts is None else starts
    moves, _, change = _live_changes(arrays(entries))
    total = np.r_[np.zeros(1, dtype=change.dtype), np.cumsum(change)]
    points = total[np.r_[np.searchsorted(moves, np.asarray(starts, dtype=np.int64)),
                         len(moves)]].tolist()
    return [p - points[0] for p in points]


def _alloc_sites(a, allocs: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(each alloc's site, as an index into the sites' names; the names): by its stack, or for
    one without frames by its user_metadata tag. Each stack and tag is named once."""
    ids: dict[str, int] = {}
    stacks = a.stack[allocs]
    named = np.full(len(a.stacks), -1)       # each stack's site (-1: none, or no frames)
    for stack in np.flatnonzero(np.bincount(stacks, minlength=len(a.stacks))).tolist():
        if a.stacks[stack]:
            named[stack] = ids.setdefault(site_name({"frames": a.stacks[stack]}), len(ids))
    site = named[stacks]
    bare = np.flatnonzero(site < 0)
    if len(bare):
        extras = a.extra[allocs[bare]]
        tagged = np.full(len(a.extras), -1)  # each extra's site: by its user_metadata
        for extra in np.flatnonzero(np.bincount(extras, minlength=len(a.extras))).tolist():
            tagged[extra] = ids.setdefault(site_name(
                {"user_metadata": a.extras[extra].get("user_metadata")}), len(ids))
        site[bare] = tagged[extras]
    return site, list(ids)


def _live_changes(a) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions of the allocs and of the frees that end a live block, in entry order; the
    alloc each belongs to; the bytes each adds). A live block is what an alloc made at its
    address until the first free_requested or free_completed there; an alloc over a live
    block replaces it, and the bytes of the one replaced stay counted."""
    known = a.cache.get("live_changes")
    if known is None:
        positions, first, actions, _ = block_order(a)
        ends = np.flatnonzero((actions[1:] != ALLOC) & (actions[:-1] == ALLOC) & ~first[1:]) + 1
        owner = np.full(len(a), -1, dtype=index_type(len(a)))
        allocs = np.flatnonzero(a.action == ALLOC)
        owner[allocs] = allocs
        owner[positions[ends]] = positions[ends - 1]
        moves = np.flatnonzero(owner >= 0).astype(owner.dtype)
        owner = owner[moves]
        size = sizes(a)[owner]
        known = a.cache["live_changes"] = (moves, owner,
                                           np.where(moves == owner, size, -size))
    return known


