"""How far each steady layout of the predictive pool is from the fewest pages possible.

    python bench/steady_bound.py TRACE ... [--moments N]        # needs scipy: pip install scipy

A layout is placed around the blocks the pool holds when it takes over: long-lived blocks the
pool placed before any step was known (weights, optimizer state) and the previous step's
instances of the blocks that cross the cut. Those do not move, so the holes between them bound
what any layout can reserve, above the steady live peak in whole pages (the replay's floor).

For each layout cut at a step boundary, at the N busiest moments of its step (default 60), an
integer program (scipy's HiGHS) assigns the blocks live at that moment to the free gaps around
the held blocks, each block whole inside one gap, and counts the fewest pages the gaps must
map: a page already touched by a held block costs nothing. The largest count over the moments
is a lower bound for every layout (any layout places each moment's blocks so), and the layout
that reaches it reserves the least any plan can from that takeover.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from npumem.alloc import predictive
from npumem.alloc.settings import AllocatorSettings
from npumem.alloc.step_plan import PAGE, rotated
from npumem.trace import read_trace
from npumem.whatif.replay import replay


def pages_touched(ranges) -> set[int]:
    return {page for start, end in ranges for page in range(start // PAGE, (end - 1) // PAGE + 1)}


def least_pages(sizes: list[int], held: list[tuple[int, int]], milp) -> int:
    """The fewest pages that map `held` ranges and `sizes` blocks placed whole in the gaps
    between them (or above them); a lower bound (a block's bytes in a gap beyond the gap's
    free bytes on held pages need new pages)."""
    from scipy.optimize import Bounds, LinearConstraint
    from scipy.sparse import lil_matrix

    held = sorted(held)
    touched = pages_touched(held)
    gaps, top = [], 0
    for start, end in held:
        if start > top:
            gaps.append((top, start))
        top = max(top, end)
    gaps.append((top, top + sum(sizes) + PAGE))          # above every held block

    def free_on_touched(low, high):
        return sum(min(high, (page + 1) * PAGE) - max(low, page * PAGE)
                   for page in range(low // PAGE, (high - 1) // PAGE + 1) if page in touched)

    pairs = [(i, g) for i, size in enumerate(sizes) for g, (low, high) in enumerate(gaps)
             if size <= high - low]
    count = len(pairs) + len(gaps)                  # x[item, gap] (binary), then pages per gap
    rows = lil_matrix((len(sizes) + 2 * len(gaps), count))
    for column, (i, g) in enumerate(pairs):
        rows[i, column] = 1                                         # each block in one gap
        rows[len(sizes) + g, column] = sizes[i]                     # within the gap
        rows[len(sizes) + len(gaps) + g, column] = sizes[i]         # bytes beyond free ones...
    for g in range(len(gaps)):
        rows[len(sizes) + len(gaps) + g, len(pairs) + g] = -PAGE    # ...on the gap's new pages
    lower = [1] * len(sizes) + [0] * len(gaps) + [-np.inf] * len(gaps)
    upper = ([1] * len(sizes) + [high - low for low, high in gaps]
             + [free_on_touched(low, high) for low, high in gaps])
    cost = np.concatenate([np.zeros(len(pairs)), np.ones(len(gaps))])
    result = milp(cost, constraints=LinearConstraint(rows.tocsr(), lower, upper),
                  integrality=np.ones(count), bounds=Bounds(0, np.inf), options={"time_limit": 60})
    if result.x is None:
        raise RuntimeError(f"the integer program found no answer: {result.message}")
    return len(touched) + round(result.fun)


def bound(layout, taken, pinned, moments: int, milp) -> int:
    """The largest least_pages over the `moments` busiest moments of `layout`'s step."""
    template, length = layout.template, layout.template.length
    lower, upper = rotated(template, layout.boundary)
    sizes = np.asarray(template.sizes)
    whole = [(offset, offset + size) for offset, size in taken]
    loads = []
    for moment in sorted(set(lower.tolist())):
        now = (lower <= moment) & (moment < upper)
        # the previous step's instance of a crossing block, where the pool holds it, or free
        before = (upper > length) & (moment < upper - length)
        fixed = [(pinned[s], pinned[s] + int(sizes[s])) for s in np.nonzero(before)[0] if s in pinned]
        movable = sizes[now | (before & ~np.isin(np.arange(len(sizes)), list(pinned)))]
        loads.append((int(movable.sum()) + sum(e - s for s, e in fixed), moment, movable, fixed))
    loads.sort(key=lambda load: load[0], reverse=True)
    return max(least_pages(movable.tolist(), whole + fixed, milp)
               for _, _, movable, fixed in loads[:moments])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", metavar="TRACE")
    parser.add_argument("--moments", type=int, default=60, help="busiest moments checked (60)")
    args = parser.parse_args()
    if args.moments < 1:
        parser.error(f"--moments must be at least 1, not {args.moments}")
    try:
        from scipy.optimize import milp
    except ImportError:
        parser.error("this bench needs scipy's integer programming: pip install scipy")
    made = []
    plain = predictive.lay_out

    def recording(template, time_limit, taken, pinned, boundary):
        layout = plain(template, time_limit, taken, pinned, boundary)
        made.append((layout, list(taken), dict(pinned or {})))
        return layout

    predictive.lay_out = recording            # each layout, with what it was placed around
    try:
        report(args.traces, made, args.moments, milp)
    finally:
        predictive.lay_out = plain


def report(traces, made, moments: int, milp) -> None:
    print(f"{'trace':<22} {'steady':>7} {'floor':>6}  {'layout':<58} {'pages':>5} {'least':>5}")
    for path in traces:
        made.clear()
        try:
            result = replay(read_trace(path), "pool", AllocatorSettings(predictive=True))
        except (OSError, ValueError) as error:
            sys.exit(str(error))          # names the file
        name = pathlib.Path(path).name.split(".")[0]
        steady = f"{result.steady_reserved_over_allocated:.3f}" if result.steady_page_floor else "-"
        floor = f"{result.steady_page_floor:.3f}" if result.steady_page_floor else "-"
        settled = [entry for entry in made if not entry[0].provisional]
        if not settled:
            print(f"{name:<22} {steady:>7} {floor:>6}  no layout cut at a step boundary")
        for layout, taken, pinned in settled:
            offsets = np.asarray(layout.offsets)
            ranges = [(o, o + s) for o, s in zip(offsets.tolist(), layout.template.sizes)] \
                + [(o, o + s) for o, s in taken] \
                + [(o, o + layout.template.sizes[s]) for s, o in pinned.items()]
            pages = len(pages_touched(ranges))
            least = bound(layout, taken, pinned, moments, milp)
            print(f"{name:<22} {steady:>7} {floor:>6}  {layout.algorithm[:58]:<58} {pages:>5} "
                  f"{least:>5}", flush=True)


if __name__ == "__main__":
    main()
