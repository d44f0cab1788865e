"""/api/timeline: the totals of a time range cut into `width` buckets, each bucket's lowest and
highest level, so that a spike one entry wide among ten million still shows, and the answer
never holds more than a few numbers per pixel.

A level holds from its entry until the next, so a bucket's range is the entries inside it plus
the last one before it (the level it starts at). Buckets after the trace's end hold its last
level; before its start, its first.
"""

from __future__ import annotations

import numpy as np

from .source import Source

MAX_WIDTH = 4000
MARKS_SHOWN = 2000              # segment marks in one answer, at most


def bucket_ranges(source: Source, t0: float, t1: float, width: int):
    """(bucket start times, each bucket's [first, stop) entries, its entries' count)."""
    edges = np.linspace(t0, t1, width + 1)
    # entries strictly before each edge: the bucket [edge_k, edge_k+1) holds entries from the
    # count before edge_k to the count before edge_k+1
    before = _strictly_before(source, edges)
    before[-1] = source.positions_before([t1])[0]     # the last bucket holds t1's entries too
    n = source.series.n
    starts = np.maximum(before[:-1] - 1, 0)                # with the level it starts at
    stops = np.maximum(before[1:], starts + 1)
    stops = np.minimum(stops, n)
    starts = np.minimum(starts, n - 1)
    return edges[:-1], starts, stops, int(before[-1] - before[0])


def _strictly_before(source: Source, t: np.ndarray) -> np.ndarray:
    t = np.asarray(t, dtype=np.float64) - source.offset
    if source.times is None:
        return np.clip(np.ceil(t), 0, source.series.n).astype(np.int64)
    return np.searchsorted(source.times, t, "left").astype(np.int64)


def timeline(source: Source, t0: float | None, t1: float | None, width: int) -> dict:
    s = source.series
    lo, hi = source.t_range
    t0 = lo if t0 is None else t0
    t1 = hi if t1 is None else t1
    if not t1 > t0:
        t1 = t0 + 1.0                          # (one entry, or one moment: a visible range)
    width = max(1, min(int(width), MAX_WIDTH))
    answer = {"t0": t0, "t1": t1, "bucket": (t1 - t0) / width, "source": source.id}
    if not s.n:
        empty = {"min": [], "max": []}
        return dict(answer, t=[], allocated=empty, reserved=empty, active=None, by_category={},
                    segments_marks=[], events_in_range=0)
    t, starts, stops, count = bucket_ranges(source, t0, t1, width)

    def envelope(levels) -> dict:
        low, high = levels.min_max(starts, stops)
        return {"min": low.tolist(), "max": high.tolist()}

    by_category = {}
    for series in s.categories:
        # a category's levels: 0 (or its start), then after each of its moves; the bucket
        # [start, stop) of entries spans its levels from the last move at or before `start`
        # through the moves before `stop`
        first = np.searchsorted(series.moves, starts, "right")
        last = np.searchsorted(series.moves, stops, "left") + 1
        _, high = series.levels.min_max(first, np.maximum(last, first + 1))
        by_category[series.name] = high.tolist()
    return dict(answer, t=t.tolist(), allocated=envelope(s.allocated),
                reserved=envelope(s.reserved),
                active=envelope(s.active) if s.active is not None else None,
                by_category=by_category, segments_marks=_marks(source, starts[0], stops[-1]),
                events_in_range=count)


def _marks(source: Source, first: int, stop: int) -> list[dict]:
    """The segment events in entries [first, stop), at most MARKS_SHOWN (evenly picked)."""
    from ..trace.snapshot.columns import SEGMENT_ADD, having

    positions = source.series.segment_positions
    chosen = positions[np.searchsorted(positions, first):np.searchsorted(positions, stop)]
    if len(chosen) > MARKS_SHOWN:
        chosen = chosen[np.linspace(0, len(chosen) - 1, MARKS_SHOWN).astype(np.int64)]
    a = source.a
    adds = having(a.action[chosen], *SEGMENT_ADD)
    return [{"t": t, "kind": "map" if add else "unmap", "bytes": size, "entry": at}
            for t, add, size, at in zip(source.t_of(chosen).tolist(), adds.tolist(),
                                        a.size[chosen].tolist(), chosen.tolist())]
