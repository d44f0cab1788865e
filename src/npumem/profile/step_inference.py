"""A recording's steps (`find_steps`): those the run marked, else one inferred where the recording
repeats it.

A loop's step makes the same requests, of the same sizes from the same lines, in the same order,
and gives most of it back before the next step begins. So a period is a step when:

- the sequence of allocations, each told by its (size, stack), repeats with that period over
  most of the recording (at least MIN_COPIES copies, covering at least half its allocations);
- memory returns to a level: of the bytes a copy allocates, at most half are still live two
  copies later (the median copy) (a step's temporaries and activations are freed within it, what it hands to
  the next step is freed there; a leak keeps a little of each step). One forward pass through identical layers repeats too, but each
  layer keeps its activations for the backward pass: memory climbs layer over layer and never
  comes back, so that is no step, and neither is a run cut short by an out-of-memory in its
  first steps.

The step begins where the copies hold least (their usual low point), so that a boundary falls
between two steps and not inside one. The candidate periods are the distances between
repeats of the same request; each is scored on the whole recording at once (numpy), and the
one covering most of it, the shortest among equals, is taken.

Why not `alloc.step_learner.StepLearner`, which the predictive pool uses: it learns online, from
one stream's requests as they come, and a layer that repeats confirms it as a period (it plans
an arena, where a wrong period costs a fallback to the pool). Judging leaks needs the opposite
stance, on the whole recording at once: no step unless memory also returns to a level, so that
one forward pass through identical layers is no step.
"""

from __future__ import annotations

import numpy as np

from ..trace.snapshot.columns import ALLOC, arrays, sizes
from .live_totals import live_before, live_changes
from .steps import INFERRED, NO_STEPS, Steps, marked_steps

MIN_COPIES = 4           # repeats of a step before it is believed
MIN_PERIOD = 3           # allocations in a step, at least
MATCHING = 0.8           # share of a copy's requests that match the copy before it
COVERAGE = 0.5           # share of the recording's allocations the repeats cover
RETURNS = 0.5            # share of a step's allocated bytes still live at the next, at most
CANDIDATES = 12          # periods tried: the most frequent distances between repeats
MAX_ALLOCATIONS = 400_000


def infer_steps(a) -> Steps:
    """The repeating step of the trace `a` (Arrays), or Steps with the reason there is none."""
    allocs = np.flatnonzero(a.action == ALLOC)
    # a bound on the work: past it, steps (and so leaks) are judged on the run's beginning only,
    # and every reason below says so
    cut = (f"; looked for in the first {MAX_ALLOCATIONS:,} of {len(allocs):,} allocations only"
           if len(allocs) > MAX_ALLOCATIONS else "")
    allocs = allocs[:MAX_ALLOCATIONS]
    n = len(allocs)
    if n < MIN_COPIES * MIN_PERIOD:
        return Steps(reason=f"{NO_STEPS} (only {n} allocation{'' if n == 1 else 's'}, too few "
                            f"for a step to repeat {MIN_COPIES} times)")
    tokens = _tokens(a, allocs)
    levels = live_before(a, allocs)
    tried = []
    for period in _candidates(tokens):
        region = _repeating_region(tokens, period)
        if region is None:
            continue
        start, stop = region
        tried.append((stop - start, period, start, stop))
    # most coverage first, then the shortest period (a multiple of a step repeats as well)
    tried.sort(key=lambda t: (-t[0], t[1]))
    best = tried[0][0] if tried else 0
    why = NO_STEPS
    for covered, period, start, stop in tried:
        if covered < COVERAGE * n:
            break
        copies = (stop - start) // period
        phase = _low_point(levels[start:start + copies * period], period)
        at = np.arange(start + phase, stop, period)
        kept = _kept(a, allocs, at)
        if kept > RETURNS:
            why = (f"{NO_STEPS} (a sequence of {period} allocations repeats {copies} times, but "
                   f"memory does not come back between repeats: {kept:.0%} of what each "
                   f"allocates is still live two repeats later, as in one long step or a forward pass "
                   f"through identical layers)")
            continue
        return Steps(allocs[at].tolist(), INFERRED, "a repeating sequence of allocations",
                     f"the same {period} allocations (sizes and lines) repeat {len(at)} times "
                     f"and memory returns to a level between them{cut}", period)
    if not tried:
        why = (f"{NO_STEPS} (no sequence of {MIN_PERIOD} allocations or more repeats "
               f"{MIN_COPIES} times or more: a loop whose step makes fewer, one tensor an "
               f"iteration, needs its steps marked, e.g. npumem.memory.step())")
    elif why == NO_STEPS:
        why = (f"{NO_STEPS} (what repeats covers {best / n:.0%} of the allocations, "
               f"less than {COVERAGE:.0%})")
    return Steps(reason=why + cut)


def _tokens(a, allocs: np.ndarray) -> np.ndarray:
    """Each allocation as a small integer: equal for equal (size, stack)."""
    size = sizes(a)[allocs]
    stack = _stack_ids(a, a.stack_at(allocs).astype(np.int64))
    if size.dtype == object:            # sizes past int64 (a hostile file): by size alone
        return np.unique(size.astype(str), return_inverse=True)[1]
    pairs = np.stack([size.astype(np.int64), stack], axis=1)
    return np.unique(pairs, axis=0, return_inverse=True)[1].ravel()


def _stack_ids(a, stacks: np.ndarray) -> np.ndarray:
    """Each stack index as the id of its frames' content (a list of entry dicts may hold equal
    stacks as different objects)."""
    used, inverse = np.unique(stacks, return_inverse=True)
    ids: dict = {}
    canonical = np.array([ids.setdefault(tuple((f.get("filename"), f.get("line"), f.get("name"))
                                               for f in (a.stacks[i] or ())), len(ids))
                          for i in used.tolist()], dtype=np.int64)
    return canonical[inverse.ravel()]


def _candidates(tokens: np.ndarray) -> list[int]:
    """The most frequent distances between an allocation and the next of the same kind."""
    order = np.argsort(tokens, kind="stable")
    same = tokens[order][1:] == tokens[order][:-1]
    gaps = (order[1:] - order[:-1])[same]
    gaps = gaps[(gaps >= MIN_PERIOD) & (gaps <= len(tokens) // MIN_COPIES)]
    if not len(gaps):
        return []
    values, counts = np.unique(gaps, return_counts=True)
    # the most frequent distances (a short step's), and those that span the most allocations:
    # a long step's requests each repeat once a step, so its distance is rarer than the gaps
    # within it, but covers more
    often = values[np.argsort(-counts, kind="stable")[:CANDIDATES // 2]]
    spanning = values[np.argsort(-(counts * values), kind="stable")[:CANDIDATES // 2]]
    return list(dict.fromkeys(often.tolist() + spanning.tolist()))


def _repeating_region(tokens: np.ndarray, period: int) -> tuple[int, int] | None:
    """The longest stretch [start, stop) of allocations in which each copy of `period` matches
    the one before it (MATCHING of its requests), at least MIN_COPIES copies long."""
    same = np.r_[0, np.cumsum(tokens[period:] == tokens[:-period])]
    if len(same) <= period:
        return None
    share = (same[period:] - same[:-period]) / period      # copy at i against the one before
    good = np.r_[False, share >= MATCHING, False]
    edges = np.flatnonzero(good[1:] != good[:-1])
    if not len(edges):
        return None
    starts, stops = edges[0::2], edges[1::2]
    longest = int(np.argmax(stops - starts))
    start, stop = int(starts[longest]), int(stops[longest]) - 1 + 2 * period
    stop = min(stop, len(tokens))
    if (stop - start) // period < MIN_COPIES:
        return None
    return start, start + (stop - start) // period * period


def _low_point(levels: np.ndarray, period: int) -> int:
    """Where in a period the copies usually hold least."""
    return int(np.argmin(np.median(levels.reshape(-1, period), axis=0)))


def _kept(a, allocs: np.ndarray, at: np.ndarray) -> float:
    """Of the bytes each copy allocates (between boundaries `at`, indices into `allocs`), the
    share still live two boundaries later: the median over the copies, so that what the first
    steps make once (a library's workspace, optimizer state) does not count. What one step
    hands to the next (a loop's carried state, a cache replaced each step) is gone by then;
    what layer after layer keeps for the backward pass is not."""
    if len(at) < 3:
        return 1.0
    moves, owner, _ = live_changes(a)
    ends = np.full(len(a), np.iinfo(np.int64).max, dtype=np.int64)   # where each block ends
    freed = moves != owner
    ends[owner[freed]] = moves[freed]
    inside = allocs[at[0]:at[-2]]
    bounds = allocs[at]
    copy = np.searchsorted(bounds, inside, side="right") - 1          # the copy each is in
    later = bounds[copy + 2]
    size = sizes(a)[inside].astype(np.float64)
    made = np.bincount(copy, weights=size, minlength=len(at) - 2)
    kept = np.bincount(copy, weights=np.where(ends[inside] >= later, size, 0.0),
                       minlength=len(at) - 2)
    shares = kept[made > 0] / made[made > 0]
    return float(np.median(shares)) if len(shares) else 0.0


def find_steps(snapshot: dict, device: int) -> Steps:
    """`device`'s steps: marked, else inferred, else none with the reason."""
    traces = snapshot.get("device_traces") or []
    entries = traces[device] if device < len(traces) else []
    if not len(entries):
        return Steps(reason="the recording has no trace: leaks are not judged")
    marked = marked_steps(snapshot, device)
    if marked is not None:
        return marked
    return infer_steps(arrays(entries))
